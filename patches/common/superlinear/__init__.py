"""Superlinear attention pieces every engine's backend shares: the on/off switch (``switch``, standard
library only), the validated configuration (``config``) and the ragged serving batch (``ragged``).
Nothing here imports an engine."""
