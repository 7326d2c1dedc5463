"""Chat templates for the prefix-splice tests, in the shapes real models ship (for the tiny model's
tokenizer: its special tokens are <|begin_of_text|>, <|im_start|>, <|im_end|>; Llama-3's header
markers are plain text to it). Each comes with the text it puts after an assistant turn, so a test
can write the expected rest of a prompt by hand.

- ``CHATML_THINK``: ChatML with Hermes/Qwen-style tools, every assistant turn rendered with its
  reasoning (``<think>...</think>``) and its tool calls (``<tool_call>{json}</tool_call>``); as Qwen3's,
  ``enable_thinking=false`` ends the generation prompt with an empty think block.
- ``QWEN3_DROP``: the same, but, as Qwen3's template does, an assistant turn keeps its reasoning only
  after the last user message: earlier turns lose it once a new user message arrives.
- ``LLAMA3``: Llama-3-style headers (``<|start_header_id|>role<|end_header_id|>\\n\\n ... <|eot_id|>``),
  tool calls as JSON, tool results in the ``ipython`` role.
"""

from __future__ import annotations

_CHATML_TOOLS = """
{%- if tools %}
    {{- '<|im_start|>system\\n# Tools\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- endif %}"""

_CHATML_BODY = """
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- set reasoning = message.reasoning_content or message.reasoning or '' %}
        {%- if reasoning and KEEP %}
            {{- '<think>\\n' + reasoning.strip() + '\\n</think>\\n\\n' }}
        {%- endif %}
        {%- if message.content %}{{- message.content }}{%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set call = call.function if call.function is defined else call %}
            {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
            {%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""

CHATML_THINK = "{{- bos_token }}" + _CHATML_TOOLS + _CHATML_BODY.replace(" and KEEP", "")

# Qwen3's rule: the last user message (not a tool response) is the last "query"; only assistant turns
# after it keep their reasoning.
QWEN3_DROP = "{{- bos_token }}" + _CHATML_TOOLS + """
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
""" + _CHATML_BODY.replace("and KEEP", "and loop.index0 > ns.last_query")

LLAMA3 = """{{- bos_token }}
{%- if tools %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\nYou may call these functions:\\n' }}
    {%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}
    {{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- for call in message.tool_calls %}
            {%- set call = call.function if call.function is defined else call %}
            {{- '{"name": "' + call.name + '", "parameters": ' }}
            {%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
            {{- '}' }}
        {%- endfor %}
        {{- '<|eot_id|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + (message.content or '') | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""

TEMPLATES = {"chatml-think": CHATML_THINK, "qwen3-drop": QWEN3_DROP, "llama3": LLAMA3}


def after_assistant(name: str, new: list[dict], thinking: bool = True) -> str:
    """The text a template puts after an assistant turn's content: its end of turn, ``new`` (user or
    tool messages), the generation prompt. Written by hand, independently of the templates above."""
    if name == "llama3":
        text = "<|eot_id|>"
        for message in new:
            role = "ipython" if message["role"] == "tool" else message["role"]
            text += f"<|start_header_id|>{role}<|end_header_id|>\n\n{message['content'].strip()}<|eot_id|>"
        return text + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    text = "<|im_end|>\n"
    for message in new:
        if message["role"] == "tool":
            text += f"<|im_start|>user\n<tool_response>\n{message['content']}\n</tool_response><|im_end|>\n"
        else:
            text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
    return text + "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
