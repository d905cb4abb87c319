"""What clamor's tests and benchmarks share (as numpy.testing): hosts made of
network namespaces with rate-limited links (``nethosts``), and the clean-up
of what killed processes leave in /dev/shm (``leftovers``).  Nothing else in
clamor imports this package, and it uses nothing of clamor but itself."""
