"""The catalog's SGLang fixes, one subpackage each."""
