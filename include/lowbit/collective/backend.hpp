// The backend extension point: what the collectives' engine (collective/detail/engine.hpp)
// needs of a backend, written down once and checked at compile time (C++17 detection
// idiom). A backend is a tag type deriving from lowbit::backend_tag (lowbit::backend::nccl,
// mpi and node are lowbit's) and a specialisation of lowbit::backend_impl<Tag> holding the
// members below; nothing else in lowbit names a backend, so adding one adds files and edits
// no switch (docs/design.md, "Adding a backend"). Each backend checks itself where it is
// defined:
//   static_assert(lowbit::check_backend<lowbit::backend_impl<my_tag>>());
// and each missing or mistyped member fails with its own message.
//
// A backend B = backend_impl<Tag> provides the following (size_t is std::size_t; T and U
// are any element type, Codec any codec, Fb any feedback ref the engine instantiates;
// `lane` is below, `call_check`, `header_set` and `frame_header` are
// collective/detail/agreement.hpp's):
//
// Types
//   comm_type                   the communicator wrapper; has size(), rank(), check(who)
//   stream_type                 what the caller orders work on (an empty struct on the host)
//   template <class U> buffer   owning array of U: default-constructible, buffer<U>(n),
//                               move-assignable, data(), size()
//   transfer_buffer             owning bytes that the backend moves: the same, of std::byte
// Constants
//   static constexpr bool stream_ordered        calls are enqueued on a stream_type and
//                                               complete later (async() exists, sync()
//                                               waits); false: a call completes before it
//                                               returns
//   static constexpr bool needs_sum_scratch     reduce()/reduce_encode() use `acc`
//   static constexpr bool has_fallback          the fallback_* members exist: below the
//                                               crossover a call runs the transport's own
//                                               full-precision collective
//   static constexpr std::size_t header_bytes   frame_header bytes before each frame (32)
//   static constexpr bool host_frames           the engine reads received headers itself (the
//                                               frames are host memory); false: the codec
//                                               steps check the header sets they are given
// Construction and set-up (in the engine's constructor, in this order)
//   B(const comm_type&, int events, int streams)
//   static void check_comm(const comm_type&, const char* who)      refuses an unusable comm
//   static void poison(const comm_type&, const std::string& why) noexcept
//                                  after a failed call: the communicator refuses calls (and,
//                                  on a device backend, its kernels stop waiting)
//   stream-ordered backends also (a hierarchical call's wait watches two communicators):
//   static bool comm_failed(const comm_type&)   a failure its stream cannot report
//   [[noreturn]] static void raise_comm_failure(const comm_type&, const call_check&,
//                                               const std::string& where)
//   static void check_sizes(size_t send, size_t recv, size_t gather)
//   void set_transport(frame_transport, const transport::policy&, int widest_bits)
//   transfer_buffer make_transfer_buffer(size_t bytes)   collective where the backend maps
//                                                        its peers' buffers
//   frame_transport transport() const              what moves the frames (resolved)
// Every call
//   void check_alive(const char* who) const
//   template <class U> void copy(const U* in, U* out, size_t n, stream_type)  one rank
//   void set_check_stream(stream_type)             checked mode: the caller's stream
//   const std::byte* allgather_small(const void* mine, size_t bytes, call_check&)
//                                                  checked mode: every rank's fingerprint
//   void sync(stream_type, const call_check&)      waits for the stream within the deadline
//   void stamp(lane, std::byte* slot, const frame_header&, const header_set& check)
//                                                  a header with no frame after it (poisoned
//                                                  too when a header of `check` disagrees)
//   std::string disagreement() const               what the codec steps recorded; empty: none
// A low-bit call's lanes (begin, then signal/wait by event index, then end)
//   void begin(stream_type, bool overlap)   void end()
//   void signal(lane, int event)            void wait(lane, int event)
// The codec (a frame_header& is written at frame - header_bytes; a header_set names the
// headers to check before anything is written, when host_frames is false)
//   template <class Codec, class T, class Fb>
//   void encode(lane, const T* x, size_t n, std::byte* frame, const rng_key&, uint64_t index0, Fb,
//               const frame_header&)
//   template <class Codec, class U>
//   void decode(lane, const std::byte* frame, size_t n, U* out, float scale, const header_set&)
//   template <class Codec, class Fb, class U>
//   void reduce_encode(lane, const std::byte* frames, size_t stride, int num_frames, size_t n,
//                      std::byte* out_frame, const rng_key&, uint64_t index0, Fb,
//                      float* acc, U* decoded_out /*may be null*/, float scale,
//                      const header_set&, const frame_header&)
//   template <class Codec, class U>
//   void reduce(lane, const std::byte* frames, size_t stride, int num_frames, size_t n,
//               U* out, float scale, float* acc, const header_set&)
//   template <class U>
//   void accumulate_output(lane, const float* delta, size_t n, float* g, U* out,
//                          const header_set&)
// The transfers (peer_recv_off[p]: where this rank's frame for p goes in p's receive
// buffer, which a backend that writes into its peers' memory needs; two-sided backends
// ignore it)
//   void alltoallv(lane, const transfer_buffer& send, const size_t* send_bytes,
//                  const size_t* send_off, transfer_buffer& recv, const size_t* recv_bytes,
//                  const size_t* recv_off, const size_t* peer_recv_off, call_check&)
//   void allgather(lane, transfer_buffer& buf, size_t offset, size_t slot_bytes, int bits,
//                  call_check&)
// The crossover, only where has_fallback (on the caller's stream)
//   template <class T> void fallback_all_reduce(const T* in, T* out, size_t count,
//                                               reduce_op, stream_type)
//   template <class T> void fallback_reduce_scatter(const T* in, T* out, size_t count,
//                                                   size_t block, reduce_op, stream_type)
//   template <class T> void fallback_all_gather(const T* in, T* out, size_t count,
//                                               size_t block, stream_type)
//
// The checks below instantiate the templated members' declarations only, with float, a
// 4-bit absmax codec and feedback::none_ref (what every backend must accept).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "lowbit/codec/codec.hpp"
#include "lowbit/codec/philox.hpp"
#include "lowbit/collective/detail/agreement.hpp"
#include "lowbit/collective/types.hpp"
#include "lowbit/feedback/refs.hpp"

namespace lowbit {

/// Maps a backend tag to its implementation; the primary template is a readable error.
template <class Backend>
struct backend_impl {
  static_assert(dependent_false<Backend>,
                "lowbit: no implementation for this backend: include lowbit/collective/nccl.cuh "
                "(lowbit::backend::nccl), lowbit/collective/mpi.hpp (lowbit::backend::mpi) or "
                "lowbit/collective/node.cuh (lowbit::backend::node)");
};

/// Where a backend runs a step: the caller's stream, or the transfer stream.
enum class lane { compute = 0, comm = 1 };

/// True when calls of Backend's collectives are enqueued on a stream (async() exists).
template <class Backend>
inline constexpr bool stream_ordered_v = backend_impl<Backend>::stream_ordered;

namespace backend_concept {

using detail::call_check;
using detail::frame_header;
using detail::header_set;

// ---- the detection idiom ------------------------------------------------------------------
template <class, template <class> class Op, class = void>
struct detect : std::false_type {};
template <template <class> class Op, class B>
struct detect<B, Op, std::void_t<Op<B>>> : std::true_type {};
/// True when Op<B> is well-formed.
template <class B, template <class> class Op>
inline constexpr bool has = detect<B, Op>::value;

/// True when Op<B> is well-formed and is exactly R.
template <class B, template <class> class Op, class R, class = void>
struct returns_t : std::false_type {};
template <class B, template <class> class Op, class R>
struct returns_t<B, Op, R, std::void_t<Op<B>>> : std::is_same<Op<B>, R> {};
template <class B, template <class> class Op, class R>
inline constexpr bool returns = returns_t<B, Op, R>::value;

// ---- probe types --------------------------------------------------------------------------
using probe_codec = codec<quant::absmax<4>>;
using probe_fb = feedback::none_ref;
template <class X>
X& lval();  // declval as an lvalue

// ---- types and constants ------------------------------------------------------------------
template <class B>
using comm_type_t = typename B::comm_type;
template <class B>
using stream_type_t = typename B::stream_type;
template <class B>
using float_buffer_t = typename B::template buffer<float>;
template <class B>
using transfer_buffer_t = typename B::transfer_buffer;
template <class B>
using stream_ordered_t = decltype(bool{B::stream_ordered});
template <class B>
using needs_sum_scratch_t = decltype(bool{B::needs_sum_scratch});
template <class B>
using has_fallback_t = decltype(bool{B::has_fallback});
template <class B>
using header_bytes_t = decltype(std::size_t{B::header_bytes});
template <class B>
using host_frames_t = decltype(bool{B::host_frames});

template <class B>
using buffer_ops_t = decltype(float_buffer_t<B>(), float_buffer_t<B>(std::size_t{}),
                              lval<float_buffer_t<B>>() = float_buffer_t<B>(std::size_t{}),
                              static_cast<float*>(lval<float_buffer_t<B>>().data()),
                              std::size_t{lval<const float_buffer_t<B>>().size()});
template <class B>
using transfer_buffer_ops_t =
    decltype(lval<transfer_buffer_t<B>>() = std::declval<transfer_buffer_t<B>>(),
             static_cast<std::byte*>(lval<const transfer_buffer_t<B>>().data()),
             std::size_t{lval<const transfer_buffer_t<B>>().size()});

// ---- construction and set-up --------------------------------------------------------------
template <class B>
using constructor_t = decltype(B(lval<const comm_type_t<B>>(), int{}, int{}));
template <class B>
using check_comm_t = decltype(B::check_comm(lval<const comm_type_t<B>>(), "who"));
template <class B>
using check_sizes_t = decltype(B::check_sizes(std::size_t{}, std::size_t{}, std::size_t{}));
template <class B>
using set_transport_t = decltype(lval<B>().set_transport(frame_transport::automatic,
                                                         lval<const transport::policy>(), int{}));
template <class B>
using make_transfer_buffer_t = std::enable_if_t<
    std::is_same_v<decltype(lval<B>().make_transfer_buffer(std::size_t{})), transfer_buffer_t<B>>>;
template <class B>
using transport_t = decltype(lval<const B>().transport());

// ---- every call ---------------------------------------------------------------------------
template <class B>
using check_alive_t = decltype(lval<const B>().check_alive("who"));
template <class B>
using copy_t =
    decltype(lval<B>().copy(static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
                            std::size_t{}, lval<stream_type_t<B>>()));
template <class B>
using set_check_stream_t = decltype(lval<B>().set_check_stream(lval<stream_type_t<B>>()));
template <class B>
using allgather_small_t = decltype(lval<B>().allgather_small(static_cast<const void*>(nullptr),
                                                             std::size_t{}, lval<call_check>()));
template <class B>
using sync_t = decltype(lval<B>().sync(lval<stream_type_t<B>>(), lval<const call_check>()));
template <class B>
using stamp_t = decltype(lval<B>().stamp(lane::compute, static_cast<std::byte*>(nullptr),
                                         lval<const frame_header>(), lval<const header_set>()));
template <class B>
using disagreement_t = decltype(lval<const B>().disagreement());

// ---- lanes --------------------------------------------------------------------------------
template <class B>
using begin_t = decltype(lval<B>().begin(lval<stream_type_t<B>>(), bool{}));
template <class B>
using end_t = decltype(lval<B>().end());
template <class B>
using signal_t = decltype(lval<B>().signal(lane::comm, int{}));
template <class B>
using wait_t = decltype(lval<B>().wait(lane::comm, int{}));

// ---- the codec ----------------------------------------------------------------------------
template <class B>
using encode_t = decltype(lval<B>().template encode<probe_codec>(
    lane::compute, static_cast<const float*>(nullptr), std::size_t{},
    static_cast<std::byte*>(nullptr), lval<const rng_key>(), std::uint64_t{}, probe_fb{},
    lval<const frame_header>()));
template <class B>
using decode_t = decltype(lval<B>().template decode<probe_codec>(
    lane::compute, static_cast<const std::byte*>(nullptr), std::size_t{},
    static_cast<float*>(nullptr), float{}, lval<const header_set>()));
template <class B>
using reduce_encode_t = decltype(lval<B>().template reduce_encode<probe_codec>(
    lane::compute, static_cast<const std::byte*>(nullptr), std::size_t{}, int{}, std::size_t{},
    static_cast<std::byte*>(nullptr), lval<const rng_key>(), std::uint64_t{}, probe_fb{},
    static_cast<float*>(nullptr), static_cast<float*>(nullptr), float{}, lval<const header_set>(),
    lval<const frame_header>()));
template <class B>
using reduce_t = decltype(lval<B>().template reduce<probe_codec>(
    lane::compute, static_cast<const std::byte*>(nullptr), std::size_t{}, int{}, std::size_t{},
    static_cast<float*>(nullptr), float{}, static_cast<float*>(nullptr), lval<const header_set>()));
template <class B>
using accumulate_output_t = decltype(lval<B>().accumulate_output(
    lane::compute, static_cast<const float*>(nullptr), std::size_t{}, static_cast<float*>(nullptr),
    static_cast<float*>(nullptr), lval<const header_set>()));

// ---- the transfers ------------------------------------------------------------------------
template <class B>
using alltoallv_t = decltype(lval<B>().alltoallv(
    lane::comm, lval<const transfer_buffer_t<B>>(), static_cast<const std::size_t*>(nullptr),
    static_cast<const std::size_t*>(nullptr), lval<transfer_buffer_t<B>>(),
    static_cast<const std::size_t*>(nullptr), static_cast<const std::size_t*>(nullptr),
    static_cast<const std::size_t*>(nullptr), lval<call_check>()));
template <class B>
using allgather_t =
    decltype(lval<B>().allgather(lane::comm, lval<transfer_buffer_t<B>>(), std::size_t{},
                                 std::size_t{}, int{}, lval<call_check>()));

// ---- the crossover (has_fallback only) -------------------------------------------------------
template <class B>
using fallback_all_reduce_t = decltype(lval<B>().fallback_all_reduce(
    static_cast<const float*>(nullptr), static_cast<float*>(nullptr), std::size_t{}, reduce_op::sum,
    lval<stream_type_t<B>>()));
template <class B>
using fallback_reduce_scatter_t = decltype(lval<B>().fallback_reduce_scatter(
    static_cast<const float*>(nullptr), static_cast<float*>(nullptr), std::size_t{}, std::size_t{},
    reduce_op::sum, lval<stream_type_t<B>>()));
template <class B>
using fallback_all_gather_t = decltype(lval<B>().fallback_all_gather(
    static_cast<const float*>(nullptr), static_cast<float*>(nullptr), std::size_t{}, std::size_t{},
    lval<stream_type_t<B>>()));

template <class B>
using poison_t = decltype(B::poison(lval<const comm_type_t<B>>(), lval<const std::string>()));
template <class B>
using comm_failed_t = decltype(bool{B::comm_failed(lval<const comm_type_t<B>>())});
template <class B>
using raise_comm_failure_t = decltype(B::raise_comm_failure(
    lval<const comm_type_t<B>>(), lval<const call_check>(), lval<const std::string>()));

template <class B, class = void>
struct failure_ok : std::true_type {};  // no stream_ordered_t: reported by its own check
template <class B>
struct failure_ok<B, std::enable_if_t<has<B, stream_ordered_t>>>
    : std::bool_constant<!B::stream_ordered ||
                         (has<B, comm_failed_t> && has<B, raise_comm_failure_t>)> {};

template <class B, class = void>
struct fallback_ok : std::true_type {};  // no has_fallback_t: reported by its own check
template <class B>
struct fallback_ok<B, std::enable_if_t<has<B, has_fallback_t>>>
    : std::bool_constant<!B::has_fallback ||
                         (has<B, fallback_all_reduce_t> && has<B, fallback_reduce_scatter_t> &&
                          has<B, fallback_all_gather_t>)> {};

}  // namespace backend_concept

/// True when B provides every member the engine uses (the list above).
template <class B>
constexpr bool is_backend_impl() {
  namespace c = backend_concept;
  return c::has<B, c::comm_type_t> && c::has<B, c::stream_type_t> && c::has<B, c::buffer_ops_t> &&
         c::has<B, c::transfer_buffer_ops_t> && c::has<B, c::stream_ordered_t> &&
         c::has<B, c::needs_sum_scratch_t> && c::has<B, c::has_fallback_t> &&
         c::has<B, c::header_bytes_t> && c::has<B, c::host_frames_t> &&
         c::has<B, c::constructor_t> && c::has<B, c::check_comm_t> && c::has<B, c::check_sizes_t> &&
         c::has<B, c::set_transport_t> && c::has<B, c::make_transfer_buffer_t> &&
         c::returns<B, c::transport_t, frame_transport> && c::has<B, c::check_alive_t> &&
         c::has<B, c::copy_t> && c::has<B, c::set_check_stream_t> &&
         c::returns<B, c::allgather_small_t, const std::byte*> && c::has<B, c::sync_t> &&
         c::has<B, c::stamp_t> && c::returns<B, c::disagreement_t, std::string> &&
         c::has<B, c::begin_t> && c::has<B, c::end_t> && c::has<B, c::signal_t> &&
         c::has<B, c::wait_t> && c::has<B, c::encode_t> && c::has<B, c::decode_t> &&
         c::has<B, c::reduce_encode_t> && c::has<B, c::reduce_t> &&
         c::has<B, c::accumulate_output_t> && c::has<B, c::alltoallv_t> &&
         c::has<B, c::allgather_t> && c::fallback_ok<B>::value && c::has<B, c::poison_t> &&
         c::failure_ok<B>::value;
}
template <class B>
inline constexpr bool is_backend_impl_v = is_backend_impl<B>();

/// Fails with one message per missing or mistyped member; true otherwise. Use as
/// static_assert(check_backend<B>()).
template <class B>
constexpr bool check_backend() {
  namespace c = backend_concept;
  static_assert(c::has<B, c::comm_type_t>, "lowbit backend: needs `using comm_type`");
  static_assert(c::has<B, c::stream_type_t>, "lowbit backend: needs `using stream_type`");
  static_assert(c::has<B, c::buffer_ops_t>,
                "lowbit backend: needs `template <class U> using buffer` (default- and "
                "size-constructible, move-assignable, data(), size())");
  static_assert(c::has<B, c::transfer_buffer_ops_t>,
                "lowbit backend: needs `using transfer_buffer` (move-assignable, data() -> "
                "std::byte*, size())");
  static_assert(c::has<B, c::stream_ordered_t>,
                "lowbit backend: needs `static constexpr bool stream_ordered`");
  static_assert(c::has<B, c::needs_sum_scratch_t>,
                "lowbit backend: needs `static constexpr bool needs_sum_scratch`");
  static_assert(c::has<B, c::has_fallback_t>,
                "lowbit backend: needs `static constexpr bool has_fallback`");
  static_assert(c::has<B, c::header_bytes_t>,
                "lowbit backend: needs `static constexpr std::size_t header_bytes`");
  static_assert(c::has<B, c::host_frames_t>,
                "lowbit backend: needs `static constexpr bool host_frames`");
  static_assert(c::has<B, c::constructor_t>,
                "lowbit backend: needs a constructor (const comm_type&, int events, int streams)");
  static_assert(c::has<B, c::check_comm_t>,
                "lowbit backend: needs `static void check_comm(const comm_type&, const char*)`");
  static_assert(c::has<B, c::check_sizes_t>,
                "lowbit backend: needs `static void check_sizes(size_t, size_t, size_t)`");
  static_assert(c::has<B, c::set_transport_t>,
                "lowbit backend: needs `set_transport(frame_transport, const transport::policy&, "
                "int)`");
  static_assert(
      c::returns<B, c::make_transfer_buffer_t, typename c::detect<B, c::transfer_buffer_t>::type> ||
          c::has<B, c::make_transfer_buffer_t>,
      "lowbit backend: needs `transfer_buffer make_transfer_buffer(size_t)`");
  static_assert(c::returns<B, c::transport_t, frame_transport>,
                "lowbit backend: needs `frame_transport transport() const`");
  static_assert(c::has<B, c::check_alive_t>,
                "lowbit backend: needs `void check_alive(const char*) const`");
  static_assert(c::has<B, c::copy_t>,
                "lowbit backend: needs `template <class U> void copy(const U*, U*, size_t, "
                "stream_type)`");
  static_assert(c::has<B, c::set_check_stream_t>,
                "lowbit backend: needs `void set_check_stream(stream_type)`");
  static_assert(c::returns<B, c::allgather_small_t, const std::byte*>,
                "lowbit backend: needs `const std::byte* allgather_small(const void*, size_t, "
                "call_check&)`");
  static_assert(c::has<B, c::sync_t>,
                "lowbit backend: needs `void sync(stream_type, const call_check&)`");
  static_assert(c::has<B, c::stamp_t>,
                "lowbit backend: needs `void stamp(lane, std::byte*, const frame_header&, const "
                "header_set&)`");
  static_assert(c::returns<B, c::disagreement_t, std::string>,
                "lowbit backend: needs `std::string disagreement() const`");
  static_assert(c::has<B, c::begin_t> && c::has<B, c::end_t>,
                "lowbit backend: needs `void begin(stream_type, bool)` and `void end()`");
  static_assert(c::has<B, c::signal_t> && c::has<B, c::wait_t>,
                "lowbit backend: needs `void signal(lane, int)` and `void wait(lane, int)`");
  static_assert(
      c::has<B, c::encode_t>,
      "lowbit backend: needs `template <class Codec, class T, class Fb> void encode(lane, "
      "const T*, size_t, std::byte*, const rng_key&, uint64_t, Fb, const frame_header&)`");
  static_assert(c::has<B, c::decode_t>,
                "lowbit backend: needs `template <class Codec, class U> void decode(lane, const "
                "std::byte*, size_t, U*, float, const header_set&)`");
  static_assert(c::has<B, c::reduce_encode_t>,
                "lowbit backend: needs `template <class Codec, class Fb, class U> void "
                "reduce_encode(lane, const std::byte*, size_t, int, size_t, std::byte*, const "
                "rng_key&, uint64_t, Fb, float*, U*, float, const header_set&, const "
                "frame_header&)`");
  static_assert(c::has<B, c::reduce_t>,
                "lowbit backend: needs `template <class Codec, class U> void reduce(lane, const "
                "std::byte*, size_t, int, size_t, U*, float, float*, const header_set&)`");
  static_assert(c::has<B, c::accumulate_output_t>,
                "lowbit backend: needs `template <class U> void accumulate_output(lane, const "
                "float*, size_t, float*, U*, const header_set&)`");
  static_assert(
      c::has<B, c::alltoallv_t>,
      "lowbit backend: needs `void alltoallv(lane, const transfer_buffer&, const size_t*, "
      "const size_t*, transfer_buffer&, const size_t*, const size_t*, const size_t*, "
      "call_check&)`");
  static_assert(c::has<B, c::allgather_t>,
                "lowbit backend: needs `void allgather(lane, transfer_buffer&, size_t, size_t, "
                "int, call_check&)`");
  static_assert(
      c::fallback_ok<B>::value,
      "lowbit backend: has_fallback needs fallback_all_reduce, fallback_reduce_scatter and "
      "fallback_all_gather");
  static_assert(c::has<B, c::poison_t>,
                "lowbit backend: needs `static void poison(const comm_type&, const std::string&) "
                "noexcept`");
  static_assert(c::failure_ok<B>::value,
                "lowbit backend: a stream-ordered backend needs `static bool comm_failed(const "
                "comm_type&)` and `static void raise_comm_failure(const comm_type&, const "
                "call_check&, const std::string&)`");
  return is_backend_impl<B>();
}

namespace detail {
// The engine and the backends name these unqualified.
using ::lowbit::backend_impl;
using ::lowbit::check_backend;
using ::lowbit::is_backend_impl_v;
using ::lowbit::lane;
}  // namespace detail

}  // namespace lowbit
