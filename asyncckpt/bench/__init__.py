"""``python -m asyncckpt.bench``: the checkpoint benchmark built on the library.

Nothing in the library imports this package; it sits on top.
"""
