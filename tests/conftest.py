"""Shared test fixtures."""

import atexit
import os
import shutil
import tempfile

# Two cores on CI: keep every process to one intra-op thread unless a test says otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Device profiles that training runs measure on first use go to a cache of this test session,
# never the user's ~/.cache (a profile measured under a busy test run is not the device's).
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="flopwise-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
# The signing key (flopwise.user_key) of this test session, never the user's ~/.config/flopwise/artifact.key;
# the processes tests start inherit it, so what they sign, the tests verify.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="flopwise-test-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], ignore_errors=True)
