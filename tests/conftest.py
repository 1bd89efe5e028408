import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

# The suite's weight cache files go to a directory of its own, removed at the end (the CLI tests'
# subprocesses inherit it), not into the user's cache.
os.environ["NNRUN_WEIGHT_CACHE"] = tempfile.mkdtemp(prefix="nnrun-test-weights-")
atexit.register(shutil.rmtree, os.environ["NNRUN_WEIGHT_CACHE"], True)
