// Exceptions and the macros that raise them with the caller's file:line.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define LOWBIT_HAS_CUDA_RUNTIME 1
#else
#define LOWBIT_HAS_CUDA_RUNTIME 0
#endif

namespace lowbit {

/// Base of every exception lowbit throws; `what()` starts with "file:line: ", which
/// helps a library user debug; `message()` is the rest, for nesting it in a message that
/// names another place (a tool's command line, a document's field).
class error : public std::runtime_error {
 public:
  error(const char* file, int line, const std::string& message)
      : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + message),
        message_(message) {}
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
};

/// A call into a library that reports failure as an integer status failed; `code()` is
/// that status. Catch this for any of cuda_error, nccl_error and mpi_error.
class coded_error : public error {
 public:
  coded_error(const char* file, int line, int code, const std::string& message)
      : error(file, line, message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A CUDA runtime call failed; `code()` is the cudaError_t value as an int.
class cuda_error : public coded_error {
 public:
  using coded_error::coded_error;
};

/// An NCCL call failed (or a communicator reported an asynchronous error); `code()` is
/// the ncclResult_t value as an int.
class nccl_error : public coded_error {
 public:
  using coded_error::coded_error;
};

/// An MPI call failed (host backend); `code()` is the MPI error code.
class mpi_error : public coded_error {
 public:
  using coded_error::coded_error;
};

/// A caller broke a precondition: null or misaligned pointer, count over the
/// workspace, mismatched configuration. Thrown before any byte is sent.
class invalid_argument : public error {
 public:
  using error::error;
};

/// A blocking wait of a collective passed its deadline (collective_options::timeout):
/// some rank did not take part in time (it threw before sending, called another
/// collective, or died). The communicator is marked unusable (NCCL: aborted), so later
/// calls on it fail at once instead of waiting again.
class timeout_error : public error {
 public:
  using error::error;
};

/// The ranks disagree about a call: a frame or a fingerprint from another rank names a
/// different count, code width, codec, step or call number than this rank's call. The
/// message names both sides' values. Nothing was written to the output.
class agreement_error : public error {
 public:
  using error::error;
};

}  // namespace lowbit

#define LOWBIT_STRINGIFY_(x) #x
#define LOWBIT_STRINGIFY(x) LOWBIT_STRINGIFY_(x)

/// Throws lowbit::invalid_argument with `message` unless `cond` holds.
#define LOWBIT_EXPECTS(cond, message)                                             \
  do {                                                                            \
    if (!(cond)) throw ::lowbit::invalid_argument(__FILE__, __LINE__, (message)); \
  } while (0)

/// Throws lowbit::error: an internal invariant failed (a lowbit bug, not misuse).
#define LOWBIT_FAIL(message) throw ::lowbit::error(__FILE__, __LINE__, (message))

#if LOWBIT_HAS_CUDA_RUNTIME
/// Calls a CUDA runtime function and throws lowbit::cuda_error when it fails.
#define LOWBIT_CUDA_TRY(call)                                                          \
  do {                                                                                 \
    cudaError_t lowbit_status_ = (call);                                               \
    if (lowbit_status_ != cudaSuccess) {                                               \
      cudaGetLastError();                                                              \
      throw ::lowbit::cuda_error(__FILE__, __LINE__, static_cast<int>(lowbit_status_), \
                                 std::string(#call " failed: ") +                      \
                                     cudaGetErrorName(lowbit_status_) + " " +          \
                                     cudaGetErrorString(lowbit_status_));              \
    }                                                                                  \
  } while (0)

/// For destructors: reports a failed CUDA call on stderr instead of throwing.
#define LOWBIT_CUDA_TRY_NO_THROW(call)                                          \
  do {                                                                          \
    cudaError_t lowbit_status_ = (call);                                        \
    if (lowbit_status_ != cudaSuccess)                                          \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(lowbit_status_));                         \
  } while (0)

/// Throws lowbit::cuda_error if a kernel launch on this thread failed.
#define LOWBIT_CHECK_LAUNCH() LOWBIT_CUDA_TRY(cudaGetLastError())
#endif
