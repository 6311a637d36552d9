// An MPI_Comm wrapper for the host backend, and LOWBIT_MPI_TRY.
#pragma once

#include <mpi.h>

#include <string>
#include <utility>

#include "lowbit/core/error.hpp"

/// Calls an MPI function and throws lowbit::mpi_error when it does not return
/// MPI_SUCCESS (the communicator's error handler must be MPI_ERRORS_RETURN for MPI to
/// return instead of aborting; mpi_comm sets it on the communicators it owns).
#define LOWBIT_MPI_TRY(call)                                                       \
  do {                                                                             \
    const int lowbit_status_ = (call);                                             \
    if (lowbit_status_ != MPI_SUCCESS) {                                           \
      char lowbit_msg_[MPI_MAX_ERROR_STRING];                                      \
      int lowbit_len_ = 0;                                                         \
      MPI_Error_string(lowbit_status_, lowbit_msg_, &lowbit_len_);                 \
      throw ::lowbit::mpi_error(                                                   \
          __FILE__, __LINE__, lowbit_status_,                                      \
          std::string(#call " failed: ") + std::string(lowbit_msg_, lowbit_len_)); \
    }                                                                              \
  } while (0)

namespace lowbit::comm {

/// A communicator for the host (MPI) backend: an MPI_Comm with its rank and size.
///
/// Borrows the handle by default (the caller frees it); `mpi_comm::duplicate(c)` makes
/// an owned private copy (MPI_Comm_dup, freed in the destructor) whose error handler
/// returns errors, so collectives raise lowbit::mpi_error instead of aborting and
/// their traffic cannot match the caller's own messages. Move-only.
class mpi_comm {
 public:
  /// An empty communicator (size 0): collectives refuse it.
  mpi_comm() = default;

  /// Borrows `comm`: rank and size come from MPI. MPI must be initialised.
  explicit mpi_comm(MPI_Comm comm) : comm_(comm) {
    LOWBIT_EXPECTS(comm != MPI_COMM_NULL, "mpi_comm: the communicator is MPI_COMM_NULL");
    int initialized = 0;
    MPI_Initialized(&initialized);
    LOWBIT_EXPECTS(initialized, "mpi_comm: MPI is not initialised (call MPI_Init first)");
    LOWBIT_MPI_TRY(MPI_Comm_rank(comm, &rank_));
    LOWBIT_MPI_TRY(MPI_Comm_size(comm, &size_));
  }

  /// An owned duplicate of `comm` with MPI_ERRORS_RETURN.
  static mpi_comm duplicate(MPI_Comm comm) {
    LOWBIT_EXPECTS(comm != MPI_COMM_NULL, "mpi_comm::duplicate: the communicator is MPI_COMM_NULL");
    MPI_Comm dup = MPI_COMM_NULL;
    LOWBIT_MPI_TRY(MPI_Comm_dup(comm, &dup));
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    mpi_comm c(dup);
    c.owns_ = true;
    return c;
  }

  mpi_comm(const mpi_comm&) = delete;
  mpi_comm& operator=(const mpi_comm&) = delete;
  mpi_comm(mpi_comm&& o) noexcept { swap(o); }
  mpi_comm& operator=(mpi_comm&& o) noexcept {
    if (this != &o) {
      mpi_comm tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~mpi_comm() { release(); }

  /// The raw handle (MPI_COMM_NULL when empty).
  MPI_Comm get() const noexcept { return comm_; }
  /// This process's rank in the communicator.
  int rank() const noexcept { return rank_; }
  /// Number of ranks; 0 for an empty communicator.
  int size() const noexcept { return size_; }
  /// True when this object frees the handle.
  bool owns() const noexcept { return owns_; }
  /// True when the communicator can carry a collective.
  bool valid() const noexcept { return comm_ != MPI_COMM_NULL && size_ > 0; }

  /// Throws lowbit::invalid_argument unless the communicator is usable: empty, freed, or
  /// marked unusable by a collective that timed out on it.
  void check(const char* who) const {
    LOWBIT_EXPECTS(comm_ != MPI_COMM_NULL && size_ > 0,
                   std::string(who) + ": the MPI communicator is empty or freed (size 0)");
    LOWBIT_EXPECTS(unusable_.empty(), std::string(who) +
                                          ": the MPI communicator is unusable after an earlier "
                                          "error: " + unusable_);
  }

  /// Marks the communicator unusable (a collective on it timed out, so its ranks no longer
  /// agree on what was sent): every later collective on it throws at once. Const because
  /// collectives hold the wrapper by const reference; the mark is the wrapper's, not MPI's.
  void mark_unusable(const std::string& why) const {
    if (unusable_.empty()) unusable_ = why.empty() ? "marked unusable" : why;
  }
  /// True once mark_unusable() ran.
  bool unusable() const noexcept { return !unusable_.empty(); }

  /// Waits for every rank (MPI_Barrier).
  void barrier() const {
    check("mpi_comm::barrier");
    LOWBIT_MPI_TRY(MPI_Barrier(comm_));
  }

 private:
  void release() noexcept {
    if (owns_ && comm_ != MPI_COMM_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm_);
    }
    comm_ = MPI_COMM_NULL;
    owns_ = false;
    rank_ = 0;
    size_ = 0;
    unusable_.clear();
  }
  void swap(mpi_comm& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(owns_, o.owns_);
    std::swap(unusable_, o.unusable_);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool owns_ = false;
  mutable std::string unusable_;  ///< why collectives must not use it; empty when usable
};

}  // namespace lowbit::comm
