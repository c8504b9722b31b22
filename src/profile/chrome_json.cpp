// Trace <-> Chrome trace-event JSON (the format ui.perfetto.dev and chrome://tracing read).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unistd.h>

#include "core/json_text.h"
#include "microllm/core/error.h"
#include "microllm/profile/trace.h"

namespace microllm::profile {

namespace {

using nlohmann::json;

std::string process_name(int pid) { return pid == 0 ? "host" : str_cat("cuda:", pid - 1); }

}  // namespace

std::string Trace::to_chrome_json() const {
  json out = json::array();
  std::set<std::pair<int, int64_t>> threads;
  std::set<int> processes;
  for (const Event& e : events) {
    json j = {{"ph", std::string(1, e.phase)}, {"name", e.name}, {"cat", e.category}, {"ts", e.ts_us},
              {"pid", e.pid},                  {"tid", e.tid}};
    if (e.phase == 'X') j["dur"] = e.dur_us;
    if (!e.args.empty()) {
      json args = json::object();
      for (const auto& [name, value] : e.args) args[name] = value;
      j["args"] = args;
    }
    out.push_back(std::move(j));
    processes.insert(e.pid);
    if (e.phase == 'X') threads.insert({e.pid, e.tid});
  }
  for (int pid : processes) {
    out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0},
                   {"args", {{"name", process_name(pid)}}}});
  }
  for (const auto& [pid, tid] : threads) {
    const std::string name = pid == 0 ? str_cat("thread ", tid) : str_cat("stream ", tid);
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
  }
  return json{{"traceEvents", out}, {"displayTimeUnit", "ms"}}.dump();
}

void Trace::write(const std::string& path) const {
  const std::string temporary = str_cat(path, ".tmp-", ::getpid());
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << to_chrome_json();
    MICROLLM_CHECK(file.good(), IoError, path, "cannot write the trace");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  MICROLLM_CHECK(!error, IoError, path, "cannot move the trace into place: ", error.message());
}

Trace Trace::read(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  MICROLLM_CHECK(file.good(), IoError, path, "cannot open the trace");
  std::stringstream text;
  text << file.rdbuf();
  const json j = detail::parse_json(text.str(), path, "not a JSON trace");
  const json* events = &j;
  if (j.is_object()) {
    MICROLLM_CHECK(j.contains("traceEvents") && j["traceEvents"].is_array(), ParseError, path,
                   "a JSON object trace needs a traceEvents array");
    events = &j["traceEvents"];
  }
  MICROLLM_CHECK(events->is_array(), ParseError, path, "a trace is an array of events or {\"traceEvents\": [...]}");
  Trace trace;
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    auto fail = [&](const char* what) { throw ParseError(path, str_cat("event ", i, ": ", what)); };
    if (!e.is_object()) fail("not an object");
    const std::string phase = e.value("ph", "");
    if (phase != "X" && phase != "C") continue;  // metadata, instants, begin/end pairs: not summarized
    Event out;
    out.phase = phase[0];
    if (!e.contains("name") || !e["name"].is_string()) fail("no name");
    if (!e.contains("ts") || !e["ts"].is_number()) fail("no ts");
    out.name = e["name"].get<std::string>();
    out.category = e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    out.ts_us = e["ts"].get<double>();
    out.dur_us = e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0;
    out.pid = e.contains("pid") && e["pid"].is_number_integer() ? e["pid"].get<int>() : 0;
    out.tid = e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int64_t>() : 0;
    if (e.contains("args") && e["args"].is_object()) {
      for (const auto& [name, value] : e["args"].items()) {
        if (value.is_number()) out.args.emplace_back(name, value.get<double>());
      }
    }
    trace.events.push_back(std::move(out));
  }
  return trace;
}

}  // namespace microllm::profile
