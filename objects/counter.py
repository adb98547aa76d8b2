"""Counter: an integer with atomic add, set and compare-and-set. Never blocks."""


class Counter:
    def __init__(self, initial=0):
        if type(initial) is not int:
            raise ValueError("initial must be an int")
        self._value = initial

    def get(self):
        return self._value

    def add(self, delta=1):
        """Add `delta`; returns the new value."""
        if type(delta) is not int:
            raise ValueError("delta must be an int")
        self._value += delta
        return self._value

    def increment(self):
        return self.add(1)

    def decrement(self):
        return self.add(-1)

    def set(self, value):
        if type(value) is not int:
            raise ValueError("value must be an int")
        self._value = value
        return value

    def compare_and_set(self, expect, value):
        """Set to `value` if the counter equals `expect`; returns whether it did."""
        if type(value) is not int:
            raise ValueError("value must be an int")
        if self._value != expect:
            return False
        self._value = value
        return True
