"""Python child processes of the test session run the read audit (tests/read_audit.py).

This directory is put first on PYTHONPATH by the session, so every Python it starts imports
this module at startup; without the session's variables it does nothing.
"""

import os

if os.environ.get("TRAINPROF_READ_AUDIT_LOG"):
    import importlib.util

    _tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = os.path.join(_tests, "read_audit.py")
    _spec = importlib.util.spec_from_file_location("_trainprof_read_audit", _path)
    if _spec and _spec.loader:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        _module.install_in_child()
