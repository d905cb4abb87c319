/* pyversion.c -- the CPython this core was built for.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  The py*.c
 * files read CPython's objects through its internal layouts (a list's item
 * array, a dict's tables, the words before an instance's header, a str's
 * state bits), which change from one minor version to the next.  They were
 * checked against the minor versions in CL_PY_KNOWN_MINORS (internal.h);
 * internal.h fails the build for any other, so that a new CPython is never
 * read with an older one's assumptions.
 *
 * The module is also named for the interpreter it was built for (no stable
 * ABI tag, clamor/_build.py), but a stale module of another build can still
 * be found first (an old _clamor.abi3.so left in a source tree).  So the
 * module says what it was built for, and clamor/_native.py refuses, at
 * import, an interpreter of another minor version.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "internal.h"

unsigned long clamor_py_built_for(void) { return PY_VERSION_HEX; }

unsigned long clamor_py_known_minors(void) { return CL_PY_KNOWN_MINORS; }
#endif /* CLAMOR_WITH_PYTHON */
