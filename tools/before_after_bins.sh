# Sourced by the before/after measurement scripts (tools/lookahead_before_after.sh,
# tools/lookahead_wide.sh, tools/slot_gds_wide_dp.sh): builds one C++ tool twice, against
# this checkout's headers with one of them as a given commit had it (before) and as it is
# (after), so that both versions run the same inputs in one run.
#
#   . tools/before_after_bins.sh
#   build_before_after COMMIT HEADER SOURCE [BEFORE_FLAG ...]   # sets $tmp; $tmp/before_bin, $tmp/after_bin
build_before_after() {
  local commit=$1 header=$2 source=$3
  shift 3
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/before/skrull"
  cp cpp/include/skrull/*.hpp "$tmp/before/skrull/"
  git show "$commit:cpp/include/skrull/$header" > "$tmp/before/skrull/$header"
  local flags=(-O2 -std=c++17 -ffp-contract=off)
  g++ "${flags[@]}" -I"$tmp/before" "$@" "$source" -o "$tmp/before_bin"
  g++ "${flags[@]}" -Icpp/include "$source" -o "$tmp/after_bin"
}
