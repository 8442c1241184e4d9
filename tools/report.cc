// SPDX-License-Identifier: Apache-2.0
// `vigil report`: the command (arguments, the run over files or over memory). What it reads,
// judges, prints and writes is in report_*.cc, over the model in report_model.h.
#include "report.h"

#include <exception>
#include <fstream>
#include <sstream>

#include "cli.h"
#include "report_model.h"

namespace vigil::tool {
namespace {

using namespace report;

struct Options {
    std::string out = "vigil-report";
    bool plots = true;
    size_t top = 10;
    std::vector<std::string> inputs;
};

constexpr const char *kProg = "vigil report";

void usage(FILE *f)
{
    std::fprintf(f, "usage: vigil report [--out DIR] [--no-plots] [--top N] DIR...\n"
                    "Reads vigil-prof-*.jsonl / *.trace.json (profiler) and vigil-<host>-<pid>.jsonl\n"
                    "(telemetry) in each DIR; names the slowest rank, NIC and path; writes report.json,\n"
                    "merged.trace.json and plots into --out (default ./vigil-report).\n"
                    "  --out DIR     output directory\n"
                    "  --no-plots    skip the PNG plots\n"
                    "  --top N       collectives with the largest arrival skew to list\n");
}

// 0 parsed, 1 help shown, 2 usage error (one line on stderr).
int parse_args(int argc, char **argv, Options *o)
{
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        if (cli::is_help(a)) {
            usage(stdout);
            return 1;
        }
        if (a == "--no-plots") {
            o->plots = false;
        } else if (a == "--out" || a == "--top") {
            if (i + 1 >= argc) return cli::usage_error(stderr, kProg, a + " wants a value");
            const std::string val = argv[++i];
            if (a == "--out") {
                o->out = val;
                continue;
            }
            if (!cli::parse_int(val, size_t{0}, size_t{1000000}, &o->top))
                return cli::usage_error(stderr, kProg, "--top wants a count, not '" + val + "'");
        } else if (a.starts_with("-") && a != "-") {
            return cli::unknown_option(stderr, kProg, a);
        } else {
            o->inputs.push_back(a);
        }
    }
    if (o->inputs.empty()) return cli::usage_error(stderr, kProg, "no input directory given");
    return 0;
}

// Reads the inputs into *d, prints the report and returns the text of report.json.
std::string judge(const std::vector<Input> &inputs, size_t top, Data &d)
{
    for (const Input &in : inputs) {
        if (in.kind == Kind::kSummary) read_summary(in, d);
        else if (in.kind == Kind::kTelemetry) read_telemetry(in, d);
        else ++d.traces;
    }
    std::set<std::string> hosts; // profiler files: from their process record
    for (const auto &[stem, org] : d.process_of) hosts.insert(org.host);
    for (const Input &in : inputs) {
        const std::string stem = in.path.string().substr(0, in.path.string().size() - 11); // less ".trace.json"
        if (in.kind == Kind::kTelemetry || (in.kind == Kind::kTrace && !d.process_of.contains(stem)))
            hosts.insert(in.host);
    }
    CollResult colls;
    analyse_collectives(d, &colls);
    NetResult net;
    analyse_network(d, &net);
    print_inputs(d, hosts.size());
    print_collectives(colls, top);
    print_network(net, d, top);
    return dumps(report_json(inputs, d, colls, net), 1) + "\n";
}

const char *const kNoInput =
    "vigil report: no vigil-prof-*.jsonl, *.trace.json or vigil-*.jsonl file found\n";

int run(const Options &o)
{
    const std::vector<Input> inputs = find_inputs(o.inputs);
    if (inputs.empty()) {
        std::fputs(kNoInput, stderr);
        return 2;
    }
    Data d;
    const std::string report_text = judge(inputs, o.top, d);
    std::printf("\n== output ==\n");
    std::error_code ec;
    const fs::path out = o.out;
    fs::create_directories(out, ec);
    if (ec) {
        std::fprintf(stderr, "vigil report: cannot create %s: %s\n", out.c_str(), ec.message().c_str());
        return 1;
    }
    if (!write_file(out / "report.json", report_text)) return 1;
    size_t events = 0, traces = 0;
    std::ofstream merged(out / "merged.trace.json", std::ios::trunc);
    write_merged_trace(inputs, d, merged, &events, &traces);
    merged.close();
    if (!merged) {
        std::fprintf(stderr, "vigil report: cannot write %s: %s\n",
                     (out / "merged.trace.json").c_str(), std::strerror(errno));
        return 1;
    }
    std::printf("wrote %s, %s (%zu events from %zu traces)\n", (out / "report.json").c_str(),
                (out / "merged.trace.json").c_str(), events, traces);
    return o.plots ? run_plots(out) : 0;
}

// Runs `f`; an exception becomes exit code 1 with its message.
template <class F> int guarded(F &&f)
{
    try {
        return f();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "vigil report: %s\n", e.what());
    } catch (...) {
        std::fprintf(stderr, "vigil report: unknown error\n");
    }
    return 1;
}

} // namespace

int run_report(int argc, char **argv)
{
    return guarded([&] {
        Options o;
        if (const int rc = parse_args(argc, argv, &o); rc != 0) return rc == 1 ? 0 : rc;
        return run(o);
    });
}

int report_from_memory(const std::vector<ReportFile> &files, size_t top, std::string *report,
                       std::string *merged)
{
    return guarded([&] {
        std::map<std::string, Input> found; // in name order, as find_inputs() gives them
        for (const ReportFile &f : files)
            if (auto in = classify(f.name)) {
                in->text = &f.text;
                found.emplace(f.name, *in);
            }
        std::vector<Input> inputs;
        for (auto &[name, in] : found) inputs.push_back(in);
        if (inputs.empty()) {
            std::fputs(kNoInput, stderr);
            return 2;
        }
        Data d;
        *report = judge(inputs, top, d);
        std::ostringstream m;
        size_t events = 0, traces = 0;
        write_merged_trace(inputs, d, m, &events, &traces);
        *merged = m.str();
        return 0;
    });
}

} // namespace vigil::tool
