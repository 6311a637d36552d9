// Everything in lowbit::qsync: the QSync predictor (cost model, replayer), indicator and
// allocator, the trace loader, built-in models and clusters, and JSON I/O.
#pragma once

#include "lowbit/qsync/allocator.hpp"
#include "lowbit/qsync/cluster.hpp"
#include "lowbit/qsync/comm_calibration.hpp"
#include "lowbit/qsync/comm_model.hpp"
#include "lowbit/qsync/cost_model.hpp"
#include "lowbit/qsync/device_profile.hpp"
#include "lowbit/qsync/indicator.hpp"
#include "lowbit/qsync/models.hpp"
#include "lowbit/qsync/op_graph.hpp"
#include "lowbit/qsync/plan.hpp"
#include "lowbit/qsync/plan_io.hpp"
#include "lowbit/qsync/precision.hpp"
#include "lowbit/qsync/replayer.hpp"
#include "lowbit/qsync/simulator.hpp"
#include "lowbit/qsync/trace_loader.hpp"
