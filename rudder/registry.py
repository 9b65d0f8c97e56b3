"""Name -> class registries (policies, decision makers): one class and one decorator line each."""
from __future__ import annotations


class Registry(dict):
    def register(self, name: str):
        """Class decorator: file the class under ``name`` and give it that ``name``."""
        def add(cls):
            cls.name = name
            self[name] = cls
            return cls
        return add
