// The lowbit backend's host half alone (csrc/process_group.cpp, which needs no CUDA), as a
// module of its own: test_backend.py builds it against any torch, a CPU-only one included,
// to check the routing table and the forwarding to an inner backend without a GPU.
#include "process_group.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { lowbit_torch::bind_process_group(m); }
