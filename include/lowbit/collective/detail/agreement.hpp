// What a rank's call was, in 32 bytes (codec/frame_header.hpp): the header of every frame
// a collective sends, and the fingerprint that checked mode (collective_options::verify)
// all-gathers before a call. A receiver compares it with its own call's, so ranks that
// disagree (another count, width, codec, step or call) get a clear lowbit::agreement_error
// instead of decoding a stranger's bytes. Here: the host's side of it (the configuration
// id, the error's words, one call's agreement state).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lowbit/codec/frame_header.hpp"

namespace lowbit::detail {

/// FNV-1a of a string: a stable id of a configuration, the same in every process of a
/// build (and across builds with the same compiler).
inline std::uint32_t fnv1a(const char* s, std::uint32_t h = 2166136261u) {
  for (; *s != '\0'; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 16777619u;
  return h;
}

/// The compiler's spelling of its template arguments: every policy parameter of a
/// collective, without asking each policy for a name.
template <class... Ts>
const char* type_signature() {
#if defined(_MSC_VER)
  return __FUNCSIG__;
#else
  return __PRETTY_FUNCTION__;
#endif
}

/// What "the same call" means besides count, step and width: the types and the options
/// that change the bytes on the wire or the result.
template <class... Ts>
std::uint32_t config_id(std::uint32_t options_bits) {
  static const std::uint32_t types = fnv1a(type_signature<Ts...>());
  return (types ^ options_bits) * 16777619u;
}

/// Reads a header from unaligned bytes.
inline frame_header load_header(const std::byte* p) {
  frame_header h;
  std::memcpy(&h, p, sizeof h);
  return h;
}

/// Empty when `got`, received from rank `from`, is a frame of the call `want` describes;
/// else a sentence naming both sides' values, e.g. "rank 1's call has count 1020 where this
/// rank's (rank 0) has 1000".
inline std::string mismatch(const frame_header& got, const frame_header& want, int from) {
  const std::string them = "rank " + std::to_string(from) + "'s call";
  const std::string us = "this rank's (rank " + std::to_string(want.rank) + ")";
  const auto differ = [&](const char* what, unsigned long long a, unsigned long long b) {
    return them + " has " + what + " " + std::to_string(a) + " where " + us + " has " +
           std::to_string(b);
  };
  switch (first_difference(got, want, static_cast<std::uint32_t>(from))) {
    case header_field::none:
      return {};
    case header_field::magic:
      return "rank " + std::to_string(from) + " sent bytes that are not a lowbit frame";
    case header_field::rank:
      return "the frame from rank " + std::to_string(from) + " says it comes from rank " +
             std::to_string(got.rank);
    case header_field::poisoned:
      return "rank " + std::to_string(from) +
             " received a frame that did not match its call (its error names the values)";
    case header_field::count:
      return differ("count", got.count, want.count);
    case header_field::bits:
      return differ("code width (bits)", got.bits, want.bits);
    case header_field::config:
      return them +
             " uses another codec or configuration (element type, op, algorithm, "
             "feedback or collective) than " +
             us;
    case header_field::step:
      return differ("step", got.step, want.step);
    case header_field::seq:
      return differ("call number", got.seq, want.seq);
  }
  return "rank " + std::to_string(from) + " sent a header this build cannot read";
}

/// One call's agreement state, shared by the engine and the backend's transfers: what this
/// rank's call is, how long a wait may last, and the first disagreement seen.
struct call_check {
  const char* who = "";
  frame_header want;                    ///< this rank's call, as its frames' headers say
  std::chrono::milliseconds timeout{};  ///< of every blocking wait; zero = none
  std::string error;                    ///< the first disagreement; empty while all agree
  std::vector<char> bad;                ///< peers whose frames disagreed (size: ranks)

  call_check() = default;
  call_check(const char* w, const frame_header& h, std::chrono::milliseconds t, int ranks)
      : who(w), want(h), timeout(t), bad(static_cast<std::size_t>(ranks), 0) {}

  bool failed() const noexcept { return !error.empty(); }
  /// Records that rank `from`'s frame disagrees (`why`, from mismatch()). A peer whose call
  /// differs (not one that merely forwards another's poison) sends nothing this rank
  /// expects any more: the rest of its frames are not waited for.
  void note(int from, std::string why, bool peer_differs = true) {
    if (error.empty()) error = std::move(why);
    if (peer_differs) bad[static_cast<std::size_t>(from)] = 1;
  }
  /// Checks the header of a frame received from `from`.
  void check_frame(const std::byte* frame, int from) {
    const frame_header got = load_header(frame);
    std::string why = mismatch(got, want, from);
    if (!why.empty())
      note(from, std::move(why),
           first_difference(got, want, static_cast<std::uint32_t>(from)) != header_field::poisoned);
  }
  /// What a timeout says: the collective, its count and step, and who was waited for.
  std::string timeout_message(const std::string& waiting_for) const {
    return std::string(who) + ": timed out after " + std::to_string(timeout.count()) +
           " ms waiting for " + waiting_for + " (count " + std::to_string(want.count) + ", step " +
           std::to_string(want.step) + ", call " + std::to_string(want.seq) +
           " of this collective object); the communicator is now unusable";
  }
};

}  // namespace lowbit::detail
