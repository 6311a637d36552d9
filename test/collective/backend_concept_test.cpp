// The backend concept (collective/detail/backend_concept.hpp) on the MPI host backend, with a
// plain C++ compiler: every member the engine uses is there with the signature it uses.
// The NCCL backend is checked the same way where it is defined (backend_nccl.cuh), so every
// .cu that includes it (collective_nccl_test among them) checks it.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>

#include "lowbit/collective/detail/backend_concept.hpp"
#include "lowbit/collective/mpi.hpp"

namespace {

using lowbit::detail::backend_impl;
using lowbit::detail::check_backend;
using lowbit::detail::is_backend_impl_v;
namespace concept_ops = lowbit::detail::backend_concept;
using mpi_backend = backend_impl<lowbit::backend::mpi>;

static_assert(check_backend<mpi_backend>());

/// Not a backend at all.
struct nothing {};

/// The MPI backend less its alltoallv: one member missing.
struct no_alltoallv : mpi_backend {
  using mpi_backend::mpi_backend;
  void alltoallv() = delete;
};

/// The MPI backend whose transport() returns the wrong type.
struct wrong_transport : mpi_backend {
  using mpi_backend::mpi_backend;
  int transport() const noexcept { return 0; }
};

/// Claims the crossover without the plain collectives.
struct plain_without_members : mpi_backend {
  using mpi_backend::mpi_backend;
  static constexpr bool has_plain = true;
};

}  // namespace

TEST_CASE("the MPI backend models the backend concept") {
  STATIC_REQUIRE(is_backend_impl_v<mpi_backend>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::allgather_small_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::stamp_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::wait_for_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::set_check_stream_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::copy_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::header_bytes_t>);
  STATIC_REQUIRE(concept_ops::has<mpi_backend, concept_ops::host_frames_t>);
  STATIC_REQUIRE(concept_ops::returns<mpi_backend, concept_ops::disagreement_t, std::string>);
  // No plain collectives, and none required.
  STATIC_REQUIRE_FALSE(mpi_backend::has_plain);
  STATIC_REQUIRE_FALSE(concept_ops::has<mpi_backend, concept_ops::plain_all_reduce_t>);
}

TEST_CASE("the concept check tells a backend that lacks a member") {
  STATIC_REQUIRE_FALSE(is_backend_impl_v<nothing>);
  STATIC_REQUIRE_FALSE(is_backend_impl_v<no_alltoallv>);
  STATIC_REQUIRE_FALSE(concept_ops::has<no_alltoallv, concept_ops::alltoallv_t>);
  STATIC_REQUIRE_FALSE(is_backend_impl_v<wrong_transport>);
  STATIC_REQUIRE_FALSE(is_backend_impl_v<plain_without_members>);
  STATIC_REQUIRE_FALSE(concept_ops::plain_ok<plain_without_members>::value);
}
