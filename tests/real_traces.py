"""Where the tests find real traces, in one place.

GPU_TRACES: torch.profiler traces from real A100 and MI250 GPUs (Holistic Trace Analysis'
test data); HTA_TRACES: the V100 excerpt this repository adds; TORCH_TRACES: traces
torch.profiler wrote here on a CPU (the reader's edge cases). Each folder's README says where
its files came from.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_TRACES = ROOT / "tests" / "data" / "real-gpu-traces"
HTA_TRACES = ROOT / "tests" / "data" / "hta-traces"
TORCH_TRACES = ROOT / "tests" / "data" / "torch-profiler-traces"
