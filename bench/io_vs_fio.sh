#!/usr/bin/env bash
# zoe bench io against fio's io_uring engine on the same file, alternately (fio, zoe, fio, zoe...),
# because a virtual disk's speed swings from minute to minute. Prints each pair and the median of
# the per-round ratios zoe/fio for read and write; the target is >= 0.95.
#
# Usage: bench/io_vs_fio.sh [DIR] [SIZE] [ROUNDS]     (defaults: /var/tmp 4GiB 5)
# Env:   ZOE=path/to/zoe (default build/bin/zoe), BS=1MiB, QD=32,
#        FIO_EXTRA="..." extra fio options (default: --fixedbufs --registerfiles, like zoe's
#        registered buffers and files), JSON=out.json to also write the results as JSON.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp}
size=${2:-4GiB}
rounds=${3:-5}
zoe=${ZOE:-$here/build/bin/zoe}
bs=${BS:-1MiB}
qd=${QD:-32}
fio_extra=${FIO_EXTRA:---fixedbufs --registerfiles}
command -v fio >/dev/null || { echo "fio is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
[ -x "$zoe" ] || { echo "no zoe binary at $zoe (build first, or set ZOE=)" >&2; exit 1; }

file="$dir/zoe-bench.0.swap"
echo "# laying out $size at $file" >&2
"$zoe" bench io --path "$dir" --size "$size" --bs "$bs" --qd "$qd" --rw write --loops 1 --warmup 0 --keep --csv >/dev/null
trap 'rm -f "$file"' EXIT
fio_size=$(stat -c %s "$file")
bs_bytes=$(numfmt --from=iec "${bs%iB}" 2>/dev/null || echo 1048576)

fio_gbps() {  # rw
  local out
  out=$(fio --name=zoecmp --filename="$file" --rw="$1" --bs="$bs_bytes" --iodepth="$qd" --ioengine=io_uring \
        --direct=1 --size="$fio_size" $fio_extra --output-format=terse 2>/dev/null)
  # terse v3: field 7 = read KiB/s, field 48 = write KiB/s
  if [ "$1" = read ]; then echo "$out" | awk -F';' '{printf "%.3f", $7 * 1024 / 1e9}'
  else echo "$out" | awk -F';' '{printf "%.3f", $48 * 1024 / 1e9}'; fi
}
zoe_gbps() {  # rw
  "$zoe" bench io --path "$dir" --size "$size" --bs "$bs" --qd "$qd" --rw "$1" --loops 1 --warmup 0 --keep --csv \
    2>/dev/null | awk -F',' 'NR==2 {printf "%.3f", $5}'
}

printf "# fio %s vs zoe bench io: %s file, bs %s, qd %s, O_DIRECT, io_uring; fio options: %s\n" \
  "$(fio --version)" "$size" "$bs" "$qd" "$fio_extra"
printf "%6s %6s %10s %10s %8s\n" round rw "fio GB/s" "zoe GB/s" "zoe/fio"
declare -A ratios
json_rows=""
for r in $(seq 1 "$rounds"); do
  for rw in read write; do
    f=$(fio_gbps "$rw")
    z=$(zoe_gbps "$rw")
    ratio=$(awk -v a="$z" -v b="$f" 'BEGIN {printf "%.3f", (b > 0 ? a / b : 0)}')
    ratios[$rw]+="$ratio "
    printf "%6s %6s %10s %10s %8s\n" "$r" "$rw" "$f" "$z" "$ratio"
    json_rows+="{\"round\":$r,\"rw\":\"$rw\",\"fio_gbps\":$f,\"zoe_gbps\":$z,\"ratio\":$ratio},"
  done
done
status=OK
summary=""
for rw in read write; do
  med=$(echo ${ratios[$rw]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  verdict=$(awk -v m="$med" 'BEGIN {print (m >= 0.95 ? "OK" : "BELOW")}')
  [ "$verdict" = OK ] || status=FAILED
  printf "# median zoe/fio %-5s: %s  (target >= 0.95: %s)\n" "$rw" "$med" "$verdict"
  summary+="\"$rw\":$med,"
done
echo "# $status"
if [ -n "${JSON:-}" ]; then
  echo "{\"size\":\"$size\",\"bs\":\"$bs\",\"qd\":$qd,\"rows\":[${json_rows%,}],\"median_ratio\":{${summary%,}},\"status\":\"$status\"}" >"$JSON"
fi
