"""A typed result that still reads as the dict it replaced: :class:`KeyedRecord`.

grpokit's results (:class:`grpokit.trainer.summary.RunSummary`, :class:`grpokit.eval.evaluate.EvalResult`)
are dataclasses with a declared field for each thing they can say, read as a mapping of the keys
*present* (a field that is not set is no key), in the order the JSON file has them, so code
written for the dicts keeps working and :meth:`KeyedRecord.to_dict` is what the file holds.
Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["KeyedRecord"]


class KeyedRecord(Mapping[str, Any]):
    """A mapping of :meth:`_present`'s keys (in that order) to :meth:`_value`'s values.

    A subclass says which keys are present; a key's value is its attribute unless the subclass
    says otherwise. A value that is itself a :class:`KeyedRecord` becomes its ``to_dict()`` in
    :meth:`to_dict`.
    """

    __slots__ = ()

    def _present(self) -> list[str]:
        """The keys present, in order."""
        raise NotImplementedError

    def _value(self, key: str) -> Any:
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        """The keys present, in order, with their values (nested records as their own dicts)."""
        return {k: v.to_dict() if isinstance(v, KeyedRecord) else v for k, v in self.items()}

    def __getitem__(self, key: str) -> Any:
        if key not in self._present():
            raise KeyError(key)
        return self._value(key)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._present()))

    def __len__(self) -> int:
        return len(self._present())

    def __contains__(self, key: object) -> bool:
        return key in self._present()
