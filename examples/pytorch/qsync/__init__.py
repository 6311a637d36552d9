"""QSync's PyTorch side: from an nn.Module to lowbit-plan's inputs, and a plan back onto
the module (lowbit-plan, the C++ planner, is in tools/).

- ``qsync_model``: the torch-free half: the model JSON, plans, host samples, traces.
- ``export``: records a module's ops and profiles it (the traces lowbit-plan reads).
- ``attribution``: what an op is (leaf-module calls, torch functions taking a
  parameter), its backward on the autograd graph, the aten operators between the ops.
- ``apply_plan``: a plan's precisions applied to a module as per-module autocast.
- ``validate``: the pipeline end to end on one GPU, predicted against measured
  (``lowbit-qsync-validate``).
- ``fp8_quality``: the allocator's fp8 plan trained against bf16 and uniform fp8 (loss
  gap, step time, GEMM speed-ups; ``lowbit-qsync-fp8-quality``).
- ``zoo``: 15 models from torchvision, timm and transformers, built without weights,
  with their training steps at two batch sizes (and a tiny size for CPU tests).
- ``host_drift``, ``memory_probe``: measurements behind validate's choices
  (``lowbit-qsync-host-drift``, ``lowbit-qsync-memory-probe``).
- ``switch_probe``: what a precision switch costs under the applier (cast fit, host time
  per cast and per wrapped op), as device fields lowbit-plan takes
  (``lowbit-qsync-switch-probe``).
- ``make_test_traces``, ``trim_trace``: the C++ tests' real traces
  (``lowbit-qsync-make-test-traces``, ``lowbit-qsync-trim-trace``).

Each command is also ``python3 -m qsync.<module>`` with examples/pytorch on the path.
Nothing here imports lowbit_torch.
"""
