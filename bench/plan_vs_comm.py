#!/usr/bin/env python3
"""bench/plan_vs_comm.sh's arithmetic.

rates COMM.json MODULES   the latency and the rate beyond it, from `zoe bench comm --json`, as
                          `zoe tune --calibrate` takes them (src/cli/tune_network.cpp): the latency
                          is the mean time at the smallest size over the ops; the rate is the bus
                          bytes of the step's module sizes (MODULES: "BYTES:COUNT,..."; each module
                          counted once per op) over their time less one latency each. Also the old
                          derivation, at one size (the largest) alone. Prints "LAT GBPS GBPS_ONE".
report ROUND STEPS LAT GBPS GBPS_ONE DIR [OUT]
                          the measured comm per step against the plans DIR/plan.json and
                          DIR/plan1.json; appends to OUT. Measured: per step of DIR/train.json, the
                          least comm_s_by_rank (the rank that waited least for slower ranks: the
                          closest to the network's own time), the median of steps 3..STEPS; and
                          rank 0's time_s.comm, the same median.
"""
import json
import os
import statistics
import sys


def modules(text):
    out = {}
    for item in text.split(","):
        size, count = item.split(":")
        out[int(size)] = int(count)
    return out


def rates(comm_path, module_text):
    j = json.load(open(comm_path))
    w, mods = j["ranks"], modules(module_text)
    small = min(r["bytes"] for r in j["rows"])
    lat = statistics.mean(r["time_us"] * 1e-6 for r in j["rows"] if r["bytes"] == small)
    bus = secs = count = 0.0
    for r in j["rows"]:
        n = mods.get(r["bytes"], 0)
        bus += n * (w - 1) / w * r["bytes"]
        secs += n * r["time_us"] * 1e-6
        count += n
    if count == 0:
        sys.exit("plan_vs_comm: bench comm measured none of the module sizes")
    beyond = secs - count * lat
    gbps = bus / (beyond if beyond > 0.1 * secs else secs) / 1e9
    big = max(r["bytes"] for r in j["rows"])
    at = [r for r in j["rows"] if r["bytes"] == big]
    one = statistics.mean((w - 1) / w * r["bytes"] / (r["time_us"] * 1e-6 - lat) for r in at) / 1e9
    print(f"{lat * 1e6:.1f} {gbps:.6g} {max(one, 1e-6):.6g}")


def stage3_row(path):
    for x in json.load(open(path))["rows"]:
        p = x["placement"]
        if p["stage"] == 3 and p["offload_param"] == "none" and p["offload_optimizer"] == "none":
            return x
    sys.exit("plan_vs_comm: no stage-3 row without offload in zoe plan's output")


def report(r, steps, lat, gbps, one, tmp, out=""):
    train = json.load(open(f"{tmp}/train.json"))
    comm = [min(step) for step in zip(*train["comm_s_by_rank"])][2:]
    rank0 = [s["comm"] for s in train["step_time_s"]][2:]
    measured, measured0 = statistics.median(comm), statistics.median(rank0)
    new, old = stage3_row(f"{tmp}/plan.json"), stage3_row(f"{tmp}/plan1.json")
    pred, pred1 = new["busy_s"]["network"], old["busy_s"]["network"]
    err, err1 = (pred - measured) / measured, (pred1 - measured) / measured
    err0 = (pred - measured0) / measured0
    quart = statistics.quantiles(comm, n=4)
    print(f"round {r}: bench comm latency {float(lat):.0f} us, {float(gbps):.4f} GB/s beyond it at the module "
          f"sizes ({float(one):.4f} GB/s at the largest size alone); {new['link_bytes']['collectives']} "
          f"collectives, {new['link_bytes']['network'] / 1e6:.2f} MB per rank per step")
    print(f"round {r}: measured comm {measured:.3f} s/step, the least of the ranks (median of steps 3-{steps}, "
          f"quartiles {quart[0]:.3f}-{quart[2]:.3f}: " + " ".join(f"{c:.3f}" for c in comm) + ")")
    print(f"round {r}: rank 0's comm {measured0:.3f} s/step (" + " ".join(f"{c:.3f}" for c in rank0) + ")")
    print(f"round {r}: predicted {pred:.3f} s ({100 * err:+.1f} %; against rank 0's {100 * err0:+.1f} %); "
          f"rate at the largest size alone {pred1:.3f} s ({100 * err1:+.1f} %)")
    if out:
        rows = json.load(open(out)) if os.path.exists(out) and os.path.getsize(out) else []
        rows.append({"round": int(r), "latency_us": float(lat), "net_gbps": float(gbps),
                     "net_gbps_largest_size": float(one), "measured_comm_s": measured,
                     "comm_per_step_s": comm, "predicted_s": pred, "error": err,
                     "rank0_comm_s": measured0, "rank0_comm_per_step_s": rank0, "error_rank0": err0,
                     "predicted_largest_size_s": pred1, "error_largest_size": err1,
                     "collectives": new["link_bytes"]["collectives"], "network_bytes": new["link_bytes"]["network"]})
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "rates":
        rates(*sys.argv[2:4])
    else:
        report(*sys.argv[2:])
