// The Python module: lowbit's errors as Python exceptions, then the codec functions and
// (unless built with LOWBIT_TORCH_CODEC_ONLY, the codec alone for simulations) the
// collectives and the "lowbit" torch.distributed backend.
#include <nccl.h>
#include <torch/extension.h>

#include "bindings.h"
#include "lowbit/core/error.hpp"
#ifndef LOWBIT_TORCH_CODEC_ONLY
#include "process_group.h"
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace lowbit_torch;
  m.doc() = "lowbit's low-bit collectives and codec for PyTorch (the compiled part)";

  // lowbit's errors as the Python exceptions a caller expects. Ranks that disagree get an
  // exception of their own (a RuntimeError), so a trainer can tell a program bug apart.
  py::register_exception<lowbit::agreement_error>(m, "AgreementError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lowbit::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const lowbit::timeout_error& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    }
  });

  // The NCCL this module was compiled against (nccl.h's NCCL_VERSION_CODE) and the one it
  // calls (ncclGetVersion; 0 if that fails): _build.check_nccl_runtime compares them with
  // torch's on load.
  m.def("nccl_version", [] {
    int runtime = 0;
    if (ncclGetVersion(&runtime) != ncclSuccess) runtime = 0;
    return std::make_pair(static_cast<int>(NCCL_VERSION_CODE), runtime);
  });

  bind_codec(m);
#ifndef LOWBIT_TORCH_CODEC_ONLY
  bind_collectives(m);
  bind_process_group(m);  // the "lowbit" torch.distributed backend
  bind_lowbit_collectives(m);
#endif
}
