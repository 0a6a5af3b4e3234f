# shellcheck shell=bash
# The helpers of the prepared GPU checks, bench/device_check.sh and bench/device_mjwarp.sh
# (sourced by both, not run): the mode from the command line, the report's header and
# lines, a step under a time limit cut to the check's deadline, and the install of the
# carried wheels with the project.
#
# The sourcing script sets, before it calls them: report (the markdown file), start (the
# check's start, epoch seconds), deadline (seconds after start by which every step ends),
# step_log (the file a step's output goes to, kept until the next step), step_tail (how
# many of its last lines the report shows) and, for install_wheels, PY (the Python).

# device_mode SCRIPT [ARG]: mode=gpu without an argument, mode=cpu with --cpu; anything
# else is a usage error (exit 2) before anything is written.
device_mode() {
    case "${2:-}" in
        --cpu) mode=cpu ;;
        "") mode=gpu ;;
        *)
            echo "usage: $1 [--cpu], got '$2'" >&2
            exit 2
            ;;
    esac
}

# say LINE...: appends the lines to the report.
say() { printf '%s\n' "$@" >>"$report"; }

# device_header TITLE: starts the report afresh: TITLE and the mode, the date and commit,
# the host and the GPU when there is one.
device_header() {
    : >"$report"
    say "# $1 ($mode mode)" ""
    say "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    say "- host: $(nproc) CPUs, $(uname -m)"
    if command -v nvidia-smi >/dev/null; then
        say "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
    fi
}

# step TITLE SECONDS CMD...: runs CMD under a time limit, cut to what is left of the
# deadline, its output in $step_log, and appends that output's tail in a code block;
# returns CMD's status (124 on its time limit, 125 when under 20 s were left: not run,
# $step_log emptied).
step() {
    local title=$1 limit=$2 t0 rc left
    shift 2
    left=$((deadline - ($(date +%s) - start)))
    if [ "$left" -lt 20 ]; then
        say "" "### $title" "" "not run: the check's $deadline s were spent"
        : >"$step_log"
        return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$step_log" 2>&1
    rc=$?
    say "" "### $title" "" "\`$*\`: exit $rc, $(($(date +%s) - t0)) s" "" '```'
    tail -n "$step_tail" "$step_log" >>"$report"
    say '```'
    return $rc
}

# install_wheels SITE WHEEL...: a step that pip-installs the wheels into SITE (no index,
# no dependencies: the machine cannot download) and the project editable; on failure
# the check ends (exit 1).
install_wheels() {
    local site=$1
    shift
    step "install the wheels ($#) and the project" 120 bash -c "
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target $site $* &&
        { PYTHONPATH=$site $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . ||
          PYTHONPATH=$site $PY -m pip install -q --no-index --no-deps --no-build-isolation \
              --break-system-packages -e .; }" || {
        echo "install failed: see $report" >&2
        exit 1
    }
}
