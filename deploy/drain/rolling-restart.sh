#!/bin/sh
# Restart the web application on this instance without dropping requests: drain, restart,
# undrain, wait for /health 200 (docs/drain.md). Run it as root (the agent's control socket is
# root only) on one instance at a time, and go on to the next only when it exits 0:
#
#   for host in web1 web2 web3; do
#     ssh "root@$host" 'DRAIN_TIMEOUT=60s sh -s' < deploy/drain/rolling-restart.sh || break
#   done
#
# Settings (environment):
#   DRAIN_TIMEOUT  give up draining after this long (default 120s)
#   DRAIN_QUIET    drained once nothing new reached the app for this long (default 2s)
#   FORCE          what a drain that timed out (drain exit 1: requests still arriving) does:
#                  1, the default, restarts anyway with a warning (requests that arrive during
#                  the restart fail, as they would without a drain); 0 aborts and undrains
#   RESTART_CMD    the restart, run with sh -c (default: systemctl restart puma)
#   READY_TIMEOUT  seconds to wait for /health 200 after undrain (default 120)
#   HEALTH_URL     default http://127.0.0.1:8080/health
#   AGENT          the agent's command (default health-agent); AGENT_CONFIG, if set, is passed
#                  as --config
#
# Exit status: 0 restarted and serving; 1 not drained and FORCE=0 (undrained, not restarted);
# 2 drain failed, e.g. the agent is not running (undrained, not restarted); 3 RESTART_CMD
# failed (left drained: fix the app, then `health-agent undrain`); 4 undrain failed; 5 no
# /health 200 within READY_TIMEOUT (undrained: the balancer sends nothing until it answers).
# Interrupted before the undrain step (Ctrl-C), it undrains and exits 130.
set -eu

DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-120s}
DRAIN_QUIET=${DRAIN_QUIET:-2s}
FORCE=${FORCE:-1}
RESTART_CMD=${RESTART_CMD:-systemctl restart puma}
READY_TIMEOUT=${READY_TIMEOUT:-120}
READY_TIMEOUT=${READY_TIMEOUT%s} # "120s" is accepted too
HEALTH_URL=${HEALTH_URL:-http://127.0.0.1:8080/health}
AGENT=${AGENT:-health-agent}
AGENT_CONFIG=${AGENT_CONFIG:-}

say() { printf 'rolling-restart: %s\n' "$*"; }
fail() {
    code=$1
    shift
    printf 'rolling-restart: error: %s\n' "$*" >&2
    exit "$code"
}

case $FORCE in 0 | 1) ;; *) fail 2 "FORCE must be 0 or 1, not '$FORCE'" ;; esac
case $READY_TIMEOUT in '' | *[!0-9]*) fail 2 "READY_TIMEOUT must be whole seconds, not '$READY_TIMEOUT'" ;; esac

# $AGENT is split on purpose, so AGENT="/opt/bin/health-agent" or a wrapper with words works.
agent() {
    if [ -n "$AGENT_CONFIG" ]; then
        # shellcheck disable=SC2086
        $AGENT --config "$AGENT_CONFIG" "$@"
    else
        # shellcheck disable=SC2086
        $AGENT "$@"
    fi
}

# Until the undrain step, an interruption gives the instance back to the balancer: undrain is
# safe at any point, since /health stays 503 until the app answers again.
undrained=no
on_interrupt() {
    trap - INT TERM
    if [ "$undrained" = no ]; then
        say "interrupted: undraining"
        agent undrain || say "undrain failed: run '$AGENT undrain' by hand"
    fi
    exit 130
}
trap on_interrupt INT TERM

say "draining (timeout $DRAIN_TIMEOUT, quiet $DRAIN_QUIET)"
drain_rc=0
agent drain --timeout "$DRAIN_TIMEOUT" --quiet "$DRAIN_QUIET" || drain_rc=$?
case $drain_rc in
    0) ;;
    1)
        if [ "$FORCE" = 0 ]; then
            agent undrain || true
            fail 1 "not drained within $DRAIN_TIMEOUT and FORCE=0: undrained, nothing restarted"
        fi
        say "warning: not drained within $DRAIN_TIMEOUT; restarting anyway (FORCE=1): requests that arrive during the restart fail"
        ;;
    *)
        # The agent's message above says why (not running, not root). An undrain is tried in
        # case the drain did start.
        agent undrain >/dev/null 2>&1 || true
        fail 2 "drain failed (exit $drain_rc): nothing restarted"
        ;;
esac

say "restarting: $RESTART_CMD"
if ! sh -c "$RESTART_CMD"; then
    # Left drained on purpose: a drained instance gets no traffic, no self-heal restart and no
    # alert for a stopped app, which is what a half-done deploy needs until someone looks.
    fail 3 "'$RESTART_CMD' failed: the instance stays drained (503); fix the app, then run '$AGENT undrain'"
fi

agent undrain || fail 4 "undrain failed: the instance stays drained (503); run '$AGENT undrain'"
undrained=yes
trap - INT TERM

say "waiting up to ${READY_TIMEOUT}s for $HEALTH_URL to answer 200"
start=$(date +%s)
while ! curl -fsS -o /dev/null --max-time 5 "$HEALTH_URL" 2>/dev/null; do
    if [ $(($(date +%s) - start)) -ge "$READY_TIMEOUT" ]; then
        # The last answer, and with jq its status and first reason ("000": no answer at all).
        last=$(curl -s -o /dev/null -w 'HTTP %{http_code}' --max-time 5 "$HEALTH_URL") || true
        if command -v jq >/dev/null 2>&1; then
            why=$(curl -s --max-time 5 "$HEALTH_URL" | jq -r '"\(.status): \(.reasons[0] // "")"' 2>/dev/null) || true
            last="$last${why:+, $why}"
        fi
        fail 5 "no 200 from $HEALTH_URL within ${READY_TIMEOUT}s (last: $last); the balancer sends this instance nothing until it answers"
    fi
    sleep 1
done
say "serving: $HEALTH_URL answers 200 after $(($(date +%s) - start))s"
