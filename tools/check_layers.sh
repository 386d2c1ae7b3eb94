#!/usr/bin/env bash
# check_layers.sh — checks that squad's dependencies point one way: reads every #include "..." in
# src/ and include/ and exits non-zero, listing each problem, when
#   - a file includes a file of a higher layer (an upward include),
#   - the includes between units form a cycle (a unit is a path without its extension, so foo.c,
#     foo.h, foo.cu and foo.cuh are one unit: foo.c including bar.h and bar.c including foo.h is a
#     cycle even though no header includes itself); a header of no unit of code is looked through.
#     Each cycle is listed with its includes that do not go down a layer (every cycle has one: they
#     are the ones to remove or turn around),
#   - a file matches no line of the layer table (a new file has to be placed before it is built on),
#   - an include names no file of the tree (it would be checked against nothing).
#
# The layer table is tools/layers.txt (one place; docs/design.md section 2 draws it). An include is
# resolved as the compiler resolves it with squad's include path: next to the including file first,
# then src/, then include/. Only quoted includes are read: <...> ones are system headers.
#
# usage: tools/check_layers.sh [ROOT [TABLE]]
#   ROOT defaults to the repository this script is in, TABLE to ROOT/tools/layers.txt; paths in the
#   table and in the messages are relative to ROOT. tests/check_layers_test.sh runs it on small trees.
set -euo pipefail

root=${1:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
table=${2:-"$root/tools/layers.txt"}
[[ -d $root ]] || { echo "check_layers: no directory $root" >&2; exit 2; }
[[ -f $table ]] || { echo "check_layers: no layer table $table" >&2; exit 2; }
table=$(cd "$(dirname "$table")" && pwd)/$(basename "$table")
cd "$root"

dirs=()
for d in src include; do [[ -d $d ]] && dirs+=("$d"); done
[[ ${#dirs[@]} -gt 0 ]] || { echo "check_layers: neither src/ nor include/ in $root" >&2; exit 2; }

find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
  LC_ALL=C sort |
  LC_ALL=C awk -v table="$table" '
    # A table pattern as an anchored regular expression: "." literal, "*" any run without "/".
    function glob_to_regex(glob,   re) {
      re = glob
      gsub(/\./, "\\.", re)
      gsub(/\*/, "[^/]*", re)
      return "^" re "$"
    }
    function unit_of(path) { sub(/\.(c|h|cu|cuh)$/, "", path); return path }
    function dir_of(path) { return path ~ /\// ? substr(path, 1, match(path, /\/[^\/]*$/) - 1) : "." }
    # "a/b/../c" -> "a/c"; "a/./b" -> "a/b"
    function normalize(path,   n, parts, out, depth, i) {
      n = split(path, parts, "/")
      depth = 0
      for (i = 1; i <= n; i++) {
        if (parts[i] == "." || parts[i] == "") continue
        if (parts[i] == "..") { if (depth > 0) depth--; continue }
        out[++depth] = parts[i]
      }
      path = ""
      for (i = 1; i <= depth; i++) path = path (i > 1 ? "/" : "") out[i]
      return path
    }
    function resolve(from, name,   c) {
      c = normalize(dir_of(from) "/" name); if (c in exists) return c
      c = normalize("src/" name);           if (c in exists) return c
      c = normalize("include/" name);       if (c in exists) return c
      return ""
    }
    # Records that code unit a depends on the unit of file t, reached from the file "from" of unit
    # a by the chain "why"; looks through a header of no code unit to the files it includes.
    function depend(a, t, why, from,   b, n) {
      b = unit_of(t)
      if (b in is_code) {
        if (b == a) return
        b = unit_id[b]
        if (!((unit_id[a], b) in reach)) {
          reach[unit_id[a], b] = 1
          nedges++; edge_a[nedges] = unit_id[a]; edge_b[nedges] = b; edge_why[nedges] = why
          edge_flat[nedges] = layer[t] >= layer[from]
        }
        return
      }
      if (t in seen) { if (seen[t] == "open" && !(t in header_cycle)) header_cycle[t] = why; return }
      seen[t] = "open"
      for (n = 1; n <= ninc[t]; n++) depend(a, inc[t, n], why ", which includes " inc[t, n], from)
      seen[t] = "done"
    }
    function problem(msg) { problems[++nproblems] = "check_layers: " msg }

    BEGIN {
      while ((getline line < table) > 0) {
        sub(/#.*/, "", line)
        if (line ~ /^[ \t]*$/) continue
        sub(/^[ \t]+/, "", line)
        split(line, f, /[ \t]+/)
        if (f[1] !~ /^[0-9]+$/ || f[2] == "") {
          print "check_layers: " table ": a line is not \"LAYER PATTERN\": " line > "/dev/stderr"
          exit 2
        }
        npat++; pat_layer[npat] = f[1] + 0; pat_regex[npat] = glob_to_regex(f[2])
      }
      close(table)
      if (npat == 0) { print "check_layers: " table " places no file" > "/dev/stderr"; exit 2 }
    }

    { nfiles++; file[nfiles] = $0; exists[$0] = 1 }

    END {
      if (npat == 0) exit 2
      # each file: its layer (the first matching line) and its unit
      for (i = 1; i <= nfiles; i++) {
        p = file[i]
        layer[p] = -1
        for (k = 1; k <= npat; k++) if (p ~ pat_regex[k]) { layer[p] = pat_layer[k]; break }
        if (layer[p] < 0) problem("unplaced file: " p " (no line of tools/layers.txt matches it)")
        u = unit_of(p)
        if (!(u in unit_id)) { nunits++; unit_id[u] = nunits; unit_name[nunits] = u }
      }
      # each include: resolved and checked against the layers
      for (i = 1; i <= nfiles; i++) {
        p = file[i]
        while ((getline line < p) > 0) {
          if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
          name = line; sub(/^[^"]*"/, "", name); sub(/".*/, "", name)
          nincludes++
          target = resolve(p, name)
          if (target == "") { problem("unresolved include: " p " includes \"" name "\""); continue }
          if (layer[p] >= 0 && layer[target] >= 0 && layer[target] > layer[p])
            problem("upward include: " p " (layer " layer[p] ") includes " target " (layer " layer[target] ")")
          ninc[p]++; inc[p, ninc[p]] = target
        }
        close(p)
      }
      # The dependency graph is between code units (units with a .c or .cu file). A header of no
      # unit of code (backend.h, a module'"'"'s *_internal.h) is looked through: including it is
      # including what it includes. So a private header that includes its module'"'"'s public one makes
      # no cycle, while two modules that reach each other through it do.
      for (i = 1; i <= nfiles; i++) if (file[i] ~ /\.(c|cu)$/) is_code[unit_of(file[i])] = 1
      for (i = 1; i <= nfiles; i++) {
        p = file[i]; a = unit_of(p)
        if (!(a in is_code)) continue
        delete seen
        for (n = 1; n <= ninc[p]; n++) depend(a, inc[p, n], p " includes " inc[p, n], p)
      }
      # transitive closure (Warshall); a set of code units that reach each other is a cycle
      for (k = 1; k <= nunits; k++)
        for (i = 1; i <= nunits; i++) {
          if (!((i, k) in reach)) continue
          for (j = 1; j <= nunits; j++) if ((k, j) in reach) reach[i, j] = 1
        }
      for (i = 1; i <= nunits; i++) {
        if ((i in cycle_of) || !((i, i) in reach)) continue
        members = unit_name[i]; cycle_of[i] = i
        for (j = i + 1; j <= nunits; j++)
          if (((i, j) in reach) && ((j, i) in reach)) { cycle_of[j] = i; members = members " <-> " unit_name[j] }
        # every cycle has an include that does not go down a layer: those are the ones to remove
        msg = "include cycle: " members "; the includes in it that do not go down a layer:"
        for (e = 1; e <= nedges; e++)
          if ((edge_a[e] in cycle_of) && (edge_b[e] in cycle_of) && cycle_of[edge_a[e]] == i && cycle_of[edge_b[e]] == i &&
              edge_flat[e])
            msg = msg "\n    " edge_why[e]
        problem(msg)
      }
      # a cycle among headers of no code unit (each would see the other half-defined)
      for (i = 1; i <= nfiles; i++)
        if (file[i] in header_cycle) problem("include cycle: " file[i] " includes itself through " header_cycle[file[i]])
      for (i = 1; i <= nproblems; i++) print problems[i]
      if (nproblems > 0) {
        print "check_layers: " nproblems " problem(s) in " nfiles " files (layer table: tools/layers.txt)"
        exit 1
      }
      print "check_layers: " nfiles " files, " nincludes " includes: every file placed, no upward include, no include cycle"
    }
  '
