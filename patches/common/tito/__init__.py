"""What both engines' tito patches share: the request checks (``validate.py``) and the `multi-turn`
verify check (``check.py``)."""
