"""Adapters that let other frameworks' checkpoint APIs write through asyncckpt."""
