// The bindings of each part of the module (bindings.cpp calls them): the sources that bind
// to Python include torch's whole extension API; the rest of the glue does not.
#pragma once

#include <torch/extension.h>

namespace lowbit_torch {

void bind_codec(pybind11::module_& m);
void bind_collectives(pybind11::module_& m);
/// The lowbit torch.distributed backend's lowbit path (process_group_collectives.cpp); the
/// backend itself is process_group.h's bind_process_group.
void bind_lowbit_collectives(pybind11::module_& m);

}  // namespace lowbit_torch
