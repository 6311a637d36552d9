// The backend concept (collective/backend.hpp) on the MPI host backend, with a
// plain C++ compiler: every member the engine uses is there with the signature it uses.
// The NCCL backend is checked the same way where it is defined (backend_nccl.cuh), so every
// .cu that includes it (collective_nccl_test among them) checks it.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>

#include "lowbit/collective/backend.hpp"
#include "lowbit/collective/mpi.hpp"

namespace {

using lowbit::backend_impl;
using lowbit::check_backend;
using lowbit::is_backend_impl_v;
namespace concept_ops = lowbit::backend_concept;
using mpi_impl = backend_impl<lowbit::backend::mpi>;

static_assert(check_backend<mpi_impl>());

/// Not a backend at all.
struct nothing {};

/// The MPI backend less its alltoallv: one member missing.
struct no_alltoallv : mpi_impl {
  using mpi_impl::mpi_impl;
  void alltoallv() = delete;
};

/// The MPI backend whose transport() returns the wrong type.
struct wrong_transport : mpi_impl {
  using mpi_impl::mpi_impl;
  int transport() const noexcept { return 0; }
};

/// Claims the crossover without the plain collectives.
struct fallback_without_members : mpi_impl {
  using mpi_impl::mpi_impl;
  static constexpr bool has_fallback = true;
};

/// A backend tag of a user's own: the collectives' parameter checks accept it.
struct my_tag : lowbit::backend_tag {
  static constexpr const char* name = "mine";
};

}  // namespace

TEST_CASE("backend tags are open: any type deriving from lowbit::backend_tag") {
  STATIC_REQUIRE(lowbit::detail::is_backend_v<my_tag>);
  STATIC_REQUIRE(lowbit::detail::is_backend_v<lowbit::backend::mpi>);
  STATIC_REQUIRE(lowbit::detail::is_backend_v<lowbit::backend::node>);
  STATIC_REQUIRE_FALSE(lowbit::detail::is_backend_v<nothing>);
  STATIC_REQUIRE_FALSE(lowbit::stream_ordered_v<lowbit::backend::mpi>);
}

TEST_CASE("the MPI backend models the backend concept") {
  STATIC_REQUIRE(is_backend_impl_v<mpi_impl>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::allgather_small_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::stamp_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::sync_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::set_check_stream_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::copy_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::header_bytes_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_impl, concept_ops::host_frames_t>);
  STATIC_REQUIRE(concept_ops::returns<mpi_impl, concept_ops::disagreement_t, std::string>);
  // No plain collectives, and none required.
  STATIC_REQUIRE_FALSE(mpi_impl::has_fallback);
  STATIC_REQUIRE_FALSE(concept_ops::has<mpi_impl, concept_ops::fallback_all_reduce_t>);
}

TEST_CASE("the concept check tells a backend that lacks a member") {
  STATIC_REQUIRE_FALSE(is_backend_impl_v<nothing>);
  STATIC_REQUIRE_FALSE(is_backend_impl_v<no_alltoallv>);
  STATIC_REQUIRE_FALSE(concept_ops::has<no_alltoallv, concept_ops::alltoallv_t>);
  STATIC_REQUIRE_FALSE(is_backend_impl_v<wrong_transport>);
  STATIC_REQUIRE_FALSE(is_backend_impl_v<fallback_without_members>);
  STATIC_REQUIRE_FALSE(concept_ops::fallback_ok<fallback_without_members>::value);
}
