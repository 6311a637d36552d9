// What a call ended with on each rank, for the agreement tests of both backends: ranks that
// disagree, or never call, must all end with a clear error, none with data or a crash.
#pragma once

#include <mpi.h>

#include <exception>
#include <string>
#include <vector>

#include "collective_test_util.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::test {

inline bool last_rank() { return world_rank() == world_size() - 1; }

/// What a call ended with on this rank.
enum class outcome { ok = 0, agreement = 1, timeout = 2, invalid = 3, other = 4 };

/// Runs `f`, returning how it ended; `what` gets the exception's message.
template <class F>
outcome run(F&& f, std::string* what = nullptr) {
  try {
    f();
    return outcome::ok;
  } catch (const lowbit::agreement_error& e) {
    if (what) *what = e.what();
    return outcome::agreement;
  } catch (const lowbit::timeout_error& e) {
    if (what) *what = e.what();
    return outcome::timeout;
  } catch (const lowbit::invalid_argument& e) {
    if (what) *what = e.what();
    return outcome::invalid;
  } catch (const std::exception& e) {
    if (what) *what = e.what();
    return outcome::other;
  }
}

/// Every rank's outcome, on every rank, over MPI_COMM_WORLD (the communicator under test
/// may be unusable or aborted).
inline std::vector<int> gather_outcomes(outcome o) {
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  int mine = static_cast<int>(o);
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return all;
}

}  // namespace lowbit::test
