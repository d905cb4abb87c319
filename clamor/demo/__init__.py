"""Demos: ``clamor demo geo`` (k-nearest places from a KDTree in the
region) and ``clamor demo pages`` (pages faulting in on demand).  Built on
the public API and the runtime below it."""
