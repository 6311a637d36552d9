// What a collective object knows of its calls, shared by the flat collectives' engine and
// the hierarchical collectives: how many calls it made (frame_header::seq), the last one's
// count, the step the next call uses for stochastic rounding, and why it refuses calls
// after an error (a timeout, a dead communicator, ranks that disagreed: its private channel
// may hold stray frames, so it is retired, and a new object must be built).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/core/error.hpp"

namespace lowbit::detail {

class call_state {
 public:
  explicit call_state(std::uint32_t first_step = 0) : step_(first_step) {}

  /// The step the next call uses (each call adds one).
  std::uint32_t step() const noexcept { return step_; }
  void set_step(std::uint32_t s) noexcept { step_ = s; }
  void advance_step() noexcept { ++step_; }

  /// The number the next call gets.
  std::uint32_t next_seq() const noexcept { return seq_; }
  /// Starts a call of `count` values: returns its call number.
  std::uint32_t begin(std::size_t count) noexcept {
    last_count_ = count;
    return seq_++;
  }
  /// What a wait for the last call names: its count, step and call number.
  frame_header last() const noexcept {
    frame_header h;
    h.count = last_count_;
    h.step = step_ - 1;
    h.seq = seq_ - 1;
    return h;
  }

  /// True once an error retired this object.
  bool retired() const noexcept { return !why_.empty(); }
  /// Retires this object for `why` (the first reason stays).
  void retire(std::string why) {
    if (why_.empty()) why_ = std::move(why);
  }
  /// Throws lowbit::invalid_argument, naming the earlier error, once retired.
  void require_usable(const char* who) const {
    if (retired())
      throw invalid_argument(__FILE__, __LINE__,
                             std::string(who) +
                                 ": this collective object is unusable after an earlier error (" +
                                 why_ + "); build a new one");
  }
  /// Runs a wait: a lowbit::error from it (a timeout, a communicator's error) retires this
  /// object, and is rethrown.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const error& e) {
      retire(e.what());
      throw;
    }
  }

 private:
  std::uint32_t step_;
  std::uint32_t seq_ = 0;
  std::size_t last_count_ = 0;
  std::string why_;  ///< why this object refuses calls; empty while usable
};

}  // namespace lowbit::detail
