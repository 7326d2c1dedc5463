"""The catalog's vLLM fixes, one subpackage each."""
