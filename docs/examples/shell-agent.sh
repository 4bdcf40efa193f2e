#!/bin/sh
# A job agent in POSIX shell, with curl and jq: claim the next job, heartbeat in the
# background while it runs, report how it ended. "Agents in any language" shown, not claimed:
# tests/e2e/test_shell_agent.py runs it against a real server, with the reaper running.
#
#   JOBQUEUE_SERVER=http://127.0.0.1:8000 JOBQUEUE_WORKSPACE=<id> JOBQUEUE_AGENT=<id> \
#   JOBQUEUE_TOKEN=jqa_... sh docs/examples/shell-agent.sh
#
# A job's job_agent_config.command is an argv list; it runs with JOB_ID, JOB_ATTEMPT,
# JOB_CONTEXT_FILE (its dispatch_context, JSON, mode 600) and JOB_RESULT_FILE (JSON it may
# write: the reported result). Exit 0 reports `successful`, anything else `failure`. If the
# lease is lost (a heartbeat answered 409), the job is stopped and nothing is reported.
# Idle, it long-polls: each claim asks the server to hold it up to JOBQUEUE_WAIT_SECONDS (50)
# until a job comes, and asks again at once when a wait ends empty; against a server that
# answers early (no long-poll) it pauses JOBQUEUE_IDLE_SECONDS (1) between claims.
# JOBQUEUE_EXIT_WHEN_IDLE=1: exit when there is nothing to claim (scripts, tests; no wait).
# SIGTERM / SIGINT: end a held claim at once, or finish the current job and report it; exit.
set -u
: "${JOBQUEUE_SERVER:?}" "${JOBQUEUE_WORKSPACE:?}" "${JOBQUEUE_AGENT:?}" "${JOBQUEUE_TOKEN:?}"
API="$JOBQUEUE_SERVER/v1/workspaces/$JOBQUEUE_WORKSPACE"
IDLE_SECONDS="${JOBQUEUE_IDLE_SECONDS:-1}"
if [ "${JOBQUEUE_EXIT_WHEN_IDLE:-0}" = 1 ]; then
  WAIT_SECONDS="${JOBQUEUE_WAIT_SECONDS:-0}"
else
  WAIT_SECONDS="${JOBQUEUE_WAIT_SECONDS:-50}"
fi
WORK=$(mktemp -d) || exit 1
chmod 700 "$WORK"
stopping=0
claim_pid=
trap 'stopping=1; [ -z "$claim_pid" ] || kill "$claim_pid" 2>/dev/null' TERM INT
trap 'rm -rf "$WORK"' EXIT

log() { echo "shell-agent: $*" >&2; }

# call METHOD PATH [JSON]: the body goes to $WORK/answer, the HTTP status to stdout.
call() {
  if [ $# -ge 3 ]; then
    printf '%s' "$3" > "$WORK/request"
    curl -sS --connect-timeout 5 --max-time 60 -o "$WORK/answer" -w '%{http_code}' -X "$1" "$API/$2" \
      -H "Authorization: Bearer $JOBQUEUE_TOKEN" -H 'Content-Type: application/json' \
      --data-binary @"$WORK/request" || echo 000
  else
    curl -sS --connect-timeout 5 --max-time 60 -o "$WORK/answer" -w '%{http_code}' -X "$1" "$API/$2" \
      -H "Authorization: Bearer $JOBQUEUE_TOKEN" || echo 000
  fi
}

# claim: the next job into $WORK/answer, the HTTP status into $code. The server holds the
# request up to WAIT_SECONDS while nothing is claimable; curl runs in the background so that
# a signal ends the wait at once (the trap kills it).
claim() {
  printf '{"wait_seconds": %s}' "$WAIT_SECONDS" > "$WORK/claim-request"
  rm -f "$WORK/claim-code"
  curl -sS --connect-timeout 5 --max-time $((WAIT_SECONDS + 30)) -o "$WORK/answer" \
    -w '%{http_code}' -X POST "$API/job-agents/$JOBQUEUE_AGENT/jobs/claim" \
    -H "Authorization: Bearer $JOBQUEUE_TOKEN" -H 'Content-Type: application/json' \
    --data-binary @"$WORK/claim-request" > "$WORK/claim-code" &
  claim_pid=$!
  while kill -0 "$claim_pid" 2>/dev/null; do wait "$claim_pid"; done
  wait "$claim_pid" 2>/dev/null
  claim_pid=
  code=$(cat "$WORK/claim-code" 2>/dev/null)
  case "$code" in ''|000) code=000 ;; esac
}

heartbeat_loop() {  # job_id claim_id interval job_pid: until the job ends or the lease is lost
  trap - TERM INT  # not the agent's "finish, then stop": this loop just ends
  while sleep "$3"; do
    body=$(jq -cn --arg c "$2" '{claim_id: $c}')
    printf '%s' "$body" > "$WORK/hb-request"
    code=$(curl -sS --connect-timeout 5 --max-time 60 -o "$WORK/hb-answer" -w '%{http_code}' -X POST "$API/jobs/$1/heartbeat" \
      -H "Authorization: Bearer $JOBQUEUE_TOKEN" -H 'Content-Type: application/json' \
      --data-binary @"$WORK/hb-request" || echo 000)
    if [ "$code" = 409 ]; then
      log "job $1: lease lost ($(jq -r .code "$WORK/hb-answer")), stopping it"
      touch "$WORK/lease-lost"
      kill -TERM "$4" 2>/dev/null
      return
    fi
  done
}

run_job() {
  job_id=$(jq -r .job.id "$WORK/answer")
  claim_id=$(jq -r .claim.claim_id "$WORK/answer")
  attempt=$(jq -r .claim.attempt "$WORK/answer")
  interval=$(jq -r .claim.heartbeat_interval_seconds "$WORK/answer")
  argv=$(jq -r '.job.job_agent_config.command // [] | @sh' "$WORK/answer")
  (umask 077; jq .job.dispatch_context "$WORK/answer" > "$WORK/context.json")
  rm -f "$WORK/result.json" "$WORK/lease-lost"
  log "job $job_id attempt $attempt: claimed"
  (
    eval "set -- $argv"
    [ $# -gt 0 ] || exit 127
    JOB_ID=$job_id JOB_ATTEMPT=$attempt JOB_CONTEXT_FILE="$WORK/context.json" \
      JOB_RESULT_FILE="$WORK/result.json" exec "$@"
  ) &
  job_pid=$!
  heartbeat_loop "$job_id" "$claim_id" "$interval" "$job_pid" &
  hb_pid=$!
  wait "$job_pid"
  rc=$?
  while kill -0 "$job_pid" 2>/dev/null; do wait "$job_pid"; rc=$?; done  # a signal woke us
  kill -KILL "$hb_pid" 2>/dev/null  # whatever its traps: it must not outlive the job
  wait "$hb_pid" 2>/dev/null
  if [ -e "$WORK/lease-lost" ]; then
    return
  fi
  status=successful
  [ "$rc" = 0 ] || status=failure
  result=null
  if [ -s "$WORK/result.json" ] && jq -e . "$WORK/result.json" >/dev/null 2>&1; then
    result=$(jq -c . "$WORK/result.json")
  fi
  body=$(jq -cn --arg c "$claim_id" --arg s "$status" --arg m "exit status $rc" \
    --argjson r "$result" '{claim_id: $c, status: $s, message: $m, result: $r}')
  code=$(call PUT "jobs/$job_id/status" "$body")
  log "job $job_id: $status (report answered $code)"
}

while [ "$stopping" = 0 ]; do
  asked=$(date +%s)
  claim
  [ "$stopping" = 0 ] || [ "$code" = 200 ] || break  # a job already granted is still run
  case "$code" in
    200) run_job ;;
    204)
      [ "${JOBQUEUE_EXIT_WHEN_IDLE:-0}" = 1 ] && break
      # A wait that ran its course: ask again at once. One that ended early (a server
      # without long-poll, or at its cap of held waits): pause first.
      if [ $(( $(date +%s) - asked )) -lt $(( WAIT_SECONDS / 2 )) ] || [ "$WAIT_SECONDS" = 0 ]
      then sleep "$IDLE_SECONDS"; fi ;;
    400)
      if [ "$WAIT_SECONDS" -gt 0 ] && jq -e '.fields.wait_seconds' "$WORK/answer" >/dev/null 2>&1
      then  # a server with a lower maximum: wait less
        WAIT_SECONDS=$((WAIT_SECONDS / 2)); log "the server refused that wait: now $WAIT_SECONDS s"
      else log "claim answered 400: $(cat "$WORK/answer")"; exit 1; fi ;;
    429|5*|000) sleep "$IDLE_SECONDS" ;;  # throttled, or the server is away: try again
    *) log "claim answered $code: $(cat "$WORK/answer" 2>/dev/null)"; exit 1 ;;
  esac
done
log "stopped"
