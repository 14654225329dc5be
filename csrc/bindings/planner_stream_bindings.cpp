// torchmem._C.planner, streams and pipelines (csrc/core/planner/streams/streams.h,
// stream_planner.h, pipeline.h). Buffers cross as equal-length int lists;
// a schedule as per-buffer home streams, reads as (buffer, stream, step)
// triples and syncs as (from, after, to, before) quadruples; a graph as
// node names and costs, buffers as parallel lists, edges as pairs.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <tuple>

#include "bindings/bindings.h"
#include "bindings/planner_convert.h"
#include "core/planner/pipeline/pipeline.h"
#include "core/planner/pipeline/pipeline_unroll.h"
#include "core/planner/pipeline/stage_cut.h"
#include "core/planner/streams/stream_liveness.h"
#include "core/planner/streams/stream_planner.h"
#include "core/planner/streams/validate_streams.h"

namespace py = pybind11;

namespace torchmem::bindings {

namespace {

using planner::Buffer;
using Triple = std::tuple<int32_t, int32_t, int64_t>;
using Quad = std::tuple<int32_t, int64_t, int32_t, int64_t>;

std::vector<planner::Sync> to_syncs(const std::vector<Quad>& syncs) {
  std::vector<planner::Sync> out;
  for (const auto& [from, after, to, before] : syncs) out.push_back({from, after, to, before});
  return out;
}

planner::StreamSchedule to_schedule(const std::vector<int32_t>& home, const std::vector<Triple>& reads,
                                    const std::vector<Quad>& syncs, const std::vector<std::string>& names) {
  planner::StreamSchedule s;
  s.home = home;
  for (const auto& [buffer, stream, step] : reads) s.reads.push_back({buffer, stream, step});
  s.syncs = to_syncs(syncs);
  s.names = names;
  return s;
}


planner::PipelineGraph to_graph(const std::vector<std::string>& names, const std::vector<double>& cost,
                                const std::vector<std::string>& buffer_names, const std::vector<int32_t>& producer,
                                const std::vector<std::vector<int32_t>>& readers, const std::vector<bool>& returned,
                                const std::vector<int64_t>& size,
                                const std::vector<std::pair<int32_t, int32_t>>& edges) {
  const size_t nb = buffer_names.size();
  if (producer.size() != nb || readers.size() != nb || returned.size() != nb || size.size() != nb) {
    throw std::invalid_argument("buffer names, producers, readers, returned and sizes must have the same length");
  }
  planner::PipelineGraph g;
  g.names = names;
  g.cost = cost;
  g.edges = edges;
  for (size_t b = 0; b < nb; ++b) g.buffers.push_back({buffer_names[b], producer[b], readers[b], bool(returned[b]), size[b]});
  return g;
}

py::dict pipeline_to_dict(const planner::PipelinePlan& p) {
  py::list stages, slots;
  for (const auto& s : p.stage) {
    py::dict d;
    d["nodes"] = s.nodes;
    d["buffers"] = s.buffers;
    d["plan"] = solution_to_dict(s.plan);
    d["base"] = s.base;
    d["cost"] = s.cost;
    stages.append(d);
  }
  for (const auto& s : p.slots) {
    py::dict d;
    d["buffer"] = s.buffer;
    d["from_stage"] = s.from_stage;
    d["to_stage"] = s.to_stage;
    d["copies"] = s.copies;
    d["size"] = s.size;
    d["base"] = s.base;
    slots.append(d);
  }
  py::dict d;
  d["stages"] = stages;
  d["slots"] = slots;
  d["stage_of"] = p.stage_of;
  d["height"] = p.height;
  d["lower_bound"] = p.lower_bound;
  d["slot_bytes"] = p.slot_bytes;
  d["sequential"] = solution_to_dict(p.sequential);
  d["speedup"] = p.speedup;
  d["seconds"] = p.seconds;
  return d;
}

py::dict unrolled_to_dict(const planner::UnrolledPipeline& u) {
  std::vector<int64_t> lower, upper, size;
  for (const Buffer& b : u.buffers) {
    lower.push_back(b.lower);
    upper.push_back(b.upper);
    size.push_back(b.size);
  }
  std::vector<Triple> reads;
  for (const auto& r : u.schedule.reads) reads.emplace_back(r.buffer, r.stream, r.step);
  std::vector<Quad> syncs;
  for (const auto& s : u.schedule.syncs) syncs.emplace_back(s.from, s.after, s.to, s.before);
  py::dict d;
  d["lower"] = lower;
  d["upper"] = upper;
  d["size"] = size;
  d["home"] = u.schedule.home;
  d["reads"] = reads;
  d["syncs"] = syncs;
  d["names"] = u.schedule.names;
  d["offsets"] = u.offsets;
  d["node_step"] = u.node_step;
  d["output_step"] = u.output_step;
  return d;
}

}  // namespace

void bind_planner_streams(py::module_& p) {
  p.def("sharings", &planner::sharing_names);
  p.def(
      "solve_streams",
      [](const std::vector<int64_t>& lower, const std::vector<int64_t>& upper, const std::vector<int64_t>& size,
         const std::vector<int32_t>& home, const std::vector<Triple>& reads, const std::vector<Quad>& syncs,
         const std::vector<std::string>& names, const std::string& method, double time_limit, int64_t alignment,
         const std::string& sharing, py::object progress) {
        const std::vector<Buffer> buffers = to_buffers(lower, upper, size);
        const planner::StreamSchedule schedule = to_schedule(home, reads, syncs, names);
        planner::SolveOptions options;
        options.method = method;
        options.time_limit = time_limit;
        options.alignment = alignment;
        options.sharing = sharing;
        if (!progress.is_none()) {
          options.progress = [progress](const planner::Progress& pr) {
            py::gil_scoped_acquire gil;
            progress(pr.seconds, pr.height, pr.lower_bound, pr.phase);
          };
        }
        planner::Solution s;
        {
          py::gil_scoped_release release;
          s = planner::solve(buffers, schedule, options);
        }
        return solution_to_dict(s);
      },
      py::arg("lower"), py::arg("upper"), py::arg("size"), py::arg("home"), py::arg("reads"), py::arg("syncs"),
      py::arg("names"), py::arg("method") = "auto", py::arg("time_limit") = planner::kDefaultTimeLimit,
      py::arg("alignment") = 1, py::arg("sharing") = "auto", py::arg("progress") = py::none());
  p.def(
      "stream_lifetimes",
      [](const std::vector<int64_t>& lower, const std::vector<int64_t>& upper, const std::vector<int64_t>& size,
         const std::vector<int32_t>& home, const std::vector<Triple>& reads, const std::vector<Quad>& syncs,
         const std::vector<std::string>& names) {
        const std::vector<Buffer> buffers = to_buffers(lower, upper, size);
        const planner::StreamSchedule schedule = to_schedule(home, reads, syncs, names);
        const planner::StreamLifetimes l = planner::StreamLiveness(buffers, schedule).lifetimes();
        return py::make_tuple(l.own, l.shared, l.bound, l.horizon);
      },
      py::arg("lower"), py::arg("upper"), py::arg("size"), py::arg("home"), py::arg("reads"), py::arg("syncs"),
      py::arg("names"));
  p.def(
      "validate_streams",
      [](const std::vector<int64_t>& lower, const std::vector<int64_t>& upper, const std::vector<int64_t>& size,
         const std::vector<int32_t>& home, const std::vector<Triple>& reads, const std::vector<Quad>& syncs,
         const std::vector<std::string>& names, const std::vector<int64_t>& offsets) {
        const std::vector<Buffer> buffers = to_buffers(lower, upper, size);
        const planner::StreamSchedule schedule = to_schedule(home, reads, syncs, names);
        const planner::Validation v = planner::validate_streams(buffers, schedule, offsets);
        return py::make_tuple(v.ok, v.first, v.second, v.message);
      },
      py::arg("lower"), py::arg("upper"), py::arg("size"), py::arg("home"), py::arg("reads"), py::arg("syncs"),
      py::arg("names"), py::arg("offsets"));
  p.def(
      "happens_before",
      [](const std::vector<Quad>& syncs, const std::vector<Quad>& queries) {
        std::vector<int32_t> streams;
        for (const auto& [s, u, x, t] : queries) {
          streams.push_back(s);
          streams.push_back(x);
        }
        const planner::HappensBefore hb(streams, to_syncs(syncs));
        std::vector<bool> out;
        for (const auto& [s, u, x, t] : queries) out.push_back(hb.before(s, u, x, t));
        return out;
      },
      py::arg("syncs"), py::arg("queries"));
  p.def(
      "cut_stages",
      [](const std::vector<std::string>& names, const std::vector<double>& cost,
         const std::vector<std::string>& buffer_names, const std::vector<int32_t>& producer,
         const std::vector<std::vector<int32_t>>& readers, const std::vector<bool>& returned,
         const std::vector<int64_t>& size, const std::vector<std::pair<int32_t, int32_t>>& edges, int32_t stages,
         double tolerance) {
        const auto g = to_graph(names, cost, buffer_names, producer, readers, returned, size, edges);
        return planner::cut_stages(g, stages, tolerance);
      },
      py::arg("names"), py::arg("cost"), py::arg("buffer_names"), py::arg("producer"), py::arg("readers"),
      py::arg("returned"), py::arg("size"), py::arg("edges"), py::arg("stages"),
      py::arg("tolerance") = planner::kDefaultCutTolerance);
  p.def(
      "plan_pipeline",
      [](const std::vector<std::string>& names, const std::vector<double>& cost,
         const std::vector<std::string>& buffer_names, const std::vector<int32_t>& producer,
         const std::vector<std::vector<int32_t>>& readers, const std::vector<bool>& returned,
         const std::vector<int64_t>& size, const std::vector<std::pair<int32_t, int32_t>>& edges, int32_t stages,
         int32_t in_flight, const std::vector<int32_t>& stage_of, const std::string& method, double time_limit,
         int64_t alignment, int32_t unroll_items) {
        const auto g = to_graph(names, cost, buffer_names, producer, readers, returned, size, edges);
        planner::PipelineOptions options;
        options.stages = stages;
        options.in_flight = in_flight;
        options.stage_of = stage_of;
        options.solve.method = method;
        options.solve.time_limit = time_limit;
        options.solve.alignment = alignment;
        planner::PipelinePlan plan;
        planner::UnrolledPipeline run;
        {
          py::gil_scoped_release release;
          plan = planner::plan_pipeline(g, options);
          if (unroll_items > 0) run = planner::unroll_pipeline(g, plan, unroll_items);
        }
        py::dict d = pipeline_to_dict(plan);
        if (unroll_items > 0) d["unrolled"] = unrolled_to_dict(run);
        return d;
      },
      py::arg("names"), py::arg("cost"), py::arg("buffer_names"), py::arg("producer"), py::arg("readers"),
      py::arg("returned"), py::arg("size"), py::arg("edges"), py::arg("stages"), py::arg("in_flight"),
      py::arg("stage_of"), py::arg("method") = "auto", py::arg("time_limit") = planner::kDefaultTimeLimit,
      py::arg("alignment") = 1, py::arg("unroll_items") = 0);
}

}  // namespace torchmem::bindings
