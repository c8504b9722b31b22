#include "microllm/profile/summary.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

namespace microllm::profile {

namespace {

std::vector<SpanStats> stats_of(const std::vector<const Event*>& spans, double wall_ms, size_t rows) {
  std::map<std::pair<std::string, std::string>, SpanStats> by_name;
  for (const Event* e : spans) {
    SpanStats& s = by_name[{e->name, e->category}];
    s.name = e->name;
    s.category = e->category;
    ++s.calls;
    s.total_ms += e->dur_us / 1000.0;
    s.max_ms = std::max(s.max_ms, e->dur_us / 1000.0);
  }
  std::vector<SpanStats> out;
  for (auto& [key, s] : by_name) {
    s.mean_ms = s.total_ms / static_cast<double>(s.calls);
    s.share = wall_ms > 0 ? s.total_ms / wall_ms : 0;
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const SpanStats& a, const SpanStats& b) { return a.total_ms > b.total_ms; });
  if (out.size() > rows) out.resize(rows);
  return out;
}

// The innermost host span (the latest to start among those open) at time t, or "".
std::string host_span_at(const std::vector<const Event*>& host, double t_us) {
  const Event* best = nullptr;
  for (const Event* e : host) {
    if (e->ts_us <= t_us && t_us <= e->ts_us + e->dur_us && (!best || e->ts_us >= best->ts_us)) best = e;
  }
  return best ? best->name : "";
}

GpuActivity activity_of(int device, std::vector<const Event*> spans, const std::vector<const Event*>& host,
                        size_t rows) {
  std::sort(spans.begin(), spans.end(), [](const Event* a, const Event* b) { return a->ts_us < b->ts_us; });
  GpuActivity a;
  a.device = device;
  double busy_end = spans.front()->ts_us;
  for (const Event* e : spans) {
    const double end = e->ts_us + e->dur_us;
    if (e->ts_us > busy_end) {
      a.largest_gaps.push_back(GpuGap{device, busy_end / 1000.0, (e->ts_us - busy_end) / 1000.0,
                                      host_span_at(host, (busy_end + e->ts_us) / 2)});
      a.idle_ms += (e->ts_us - busy_end) / 1000.0;
    }
    if (end > busy_end) {
      a.busy_ms += (end - std::max(busy_end, e->ts_us)) / 1000.0;
      busy_end = end;
    }
  }
  std::sort(a.largest_gaps.begin(), a.largest_gaps.end(),
            [](const GpuGap& x, const GpuGap& y) { return x.duration_ms > y.duration_ms; });
  if (a.largest_gaps.size() > rows) a.largest_gaps.resize(rows);
  return a;
}

std::string fixed(double v, int digits = 3) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

void table(std::ostringstream& out, const char* title, const std::vector<SpanStats>& rows) {
  if (rows.empty()) return;
  out << "\n## " << title << "\n\n| span | category | calls | total ms | mean ms | max ms | share |\n"
      << "|---|---|---:|---:|---:|---:|---:|\n";
  for (const SpanStats& s : rows) {
    out << "| " << s.name << " | " << s.category << " | " << s.calls << " | " << fixed(s.total_ms) << " | "
        << fixed(s.mean_ms, 4) << " | " << fixed(s.max_ms) << " | " << fixed(100 * s.share, 1) << "% |\n";
  }
}

}  // namespace

TraceSummary summarize(const Trace& trace, size_t rows) {
  TraceSummary summary;
  std::vector<const Event*> spans, layers, ops, host;
  std::map<int, std::vector<const Event*>> gpu;
  double first = std::numeric_limits<double>::infinity(), last = -first;
  std::map<std::string, MemoryPeak> memory;
  for (const Event& e : trace.events) {
    if (e.phase == 'C' && e.name.rfind("memory peak ", 0) == 0) {
      MemoryPeak& m = memory[e.name.substr(12)];
      m.device = e.name.substr(12);
      m.at_peak_mib = e.args;
      m.peak_mib = 0;
      for (const auto& [category, mib] : e.args) m.peak_mib += mib;
    } else if (e.phase == 'C' && e.name.rfind("memory ", 0) == 0) {
      MemoryPeak& m = memory[e.name.substr(7)];
      m.device = e.name.substr(7);
      ++m.samples;
    }
    if (e.phase != 'X') continue;
    spans.push_back(&e);
    first = std::min(first, e.ts_us);
    last = std::max(last, e.ts_us + e.dur_us);
    if (e.category == "layer") layers.push_back(&e);
    if (e.category == "op") ops.push_back(&e);
    if (e.pid == 0) host.push_back(&e);
    else gpu[e.pid - 1].push_back(&e);
  }
  for (auto& [device, m] : memory) summary.memory.push_back(std::move(m));
  if (spans.empty()) return summary;
  summary.wall_ms = (last - first) / 1000.0;
  summary.top = stats_of(spans, summary.wall_ms, rows);
  summary.layers = stats_of(layers, summary.wall_ms, rows);
  summary.ops = stats_of(ops, summary.wall_ms, rows);
  for (const auto& [device, device_spans] : gpu) summary.gpus.push_back(activity_of(device, device_spans, host, rows));
  return summary;
}

std::string to_markdown(const TraceSummary& s) {
  std::ostringstream out;
  out << "Wall time: " << fixed(s.wall_ms) << " ms (the first span's start to the last span's end)\n";
  table(out, "Spans by total time", s.top);
  table(out, "Layers", s.layers);
  table(out, "Ops", s.ops);
  for (const MemoryPeak& m : s.memory) {
    if (m.at_peak_mib.empty()) continue;
    out << "\n## Memory of " << m.device << " at its peak: " << fixed(m.peak_mib, 1) << " MiB of live tensors ("
        << m.samples << " timeline samples)\n\n| category | MiB | share |\n|---|---:|---:|\n";
    std::vector<std::pair<std::string, double>> largest_first(m.at_peak_mib.begin(), m.at_peak_mib.end());
    std::stable_sort(largest_first.begin(), largest_first.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [category, mib] : largest_first) {
      out << "| " << category << " | " << fixed(mib, 1) << " | "
          << fixed(m.peak_mib > 0 ? 100 * mib / m.peak_mib : 0, 1) << "% |\n";
    }
  }
  for (const GpuActivity& a : s.gpus) {
    out << "\n## cuda:" << a.device << ": busy " << fixed(a.busy_ms) << " ms, idle " << fixed(a.idle_ms)
        << " ms between its first and last span\n";
    if (a.largest_gaps.empty()) continue;
    out << "\n| idle from ms | for ms | the host was in |\n|---:|---:|---|\n";
    for (const GpuGap& g : a.largest_gaps) {
      out << "| " << fixed(g.start_ms) << " | " << fixed(g.duration_ms) << " | "
          << (g.host_span.empty() ? "(no span)" : g.host_span) << " |\n";
    }
  }
  return out.str();
}

}  // namespace microllm::profile
