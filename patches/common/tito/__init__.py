"""What both engines' tito patches share: the request checks (``validate.py``), one per rule."""
