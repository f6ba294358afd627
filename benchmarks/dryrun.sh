# Sourced by the GPU step scripts: `x CMD...` runs CMD, or with dry=1 prints it once, shell-quoted, as
# "+ CMD" on fd 3 (the caller's stdout, so a step's log redirection does not catch it).
exec 3>&1
q="'"
show() {
  local out= a
  for a in "$@"; do
    [[ -z $a || $a == *[^A-Za-z0-9_@%+=:,./-]* ]] && a="$q${a//$q/$q\\$q$q}$q"
    out+="${out:+ }$a"
  done
  echo "+ $out" >&3
}
x() { if [ "$dry" = 1 ]; then show "$@"; else "$@"; fi; }
