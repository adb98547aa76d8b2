"""Counter: an integer with atomic add, set and compare-and-set. Never blocks.

The value stays within int64 (the wire's integer): a call that would leave that range raises
OverflowError and changes nothing."""

_MIN, _MAX = -(1 << 63), (1 << 63) - 1


def _int64(v, what):
    if type(v) is not int:
        raise ValueError(f"{what} must be an int")
    if not _MIN <= v <= _MAX:
        raise OverflowError(f"{what} {v} is outside the int64 range")
    return v


class Counter:
    _constructor_args = (("initial", "_initial"),)   # a get-or-create naming another is refused

    _readers = ('get',)  # read-only: served without a log entry

    def __init__(self, initial=0):
        self._value = self._initial = _int64(initial, "initial")

    def get(self):
        return self._value

    def add(self, delta=1):
        """Add `delta`; returns the new value."""
        _int64(delta, "delta")
        self._value = _int64(self._value + delta, "the result")
        return self._value

    def increment(self):
        return self.add(1)

    def decrement(self):
        return self.add(-1)

    def set(self, value):
        self._value = _int64(value, "value")
        return value

    def compare_and_set(self, expect, value):
        """Set to `value` if the counter equals `expect`; returns whether it did."""
        _int64(value, "value")
        if self._value != expect:
            return False
        self._value = value
        return True
