"""What both engines' tito patches share: the `multi-turn` verify check (``check.py``)."""
