#!/bin/sh
# Slurm TaskProlog for jobs watched by the node service (`hangwatch node`, docs/inside-evidence.md): the lines it
# prints that start with `export` go into each task's environment before it starts. They put hangwatch's bootstrap
# on the task's Python path (a beat on every optimizer step, a `checkpoint` phase around torch.save, the framework
# callbacks, and the Flight Recorder answered at a roll call) and say where the step's watcher takes the beats.
#
#   slurm.conf:  TaskProlog=/usr/share/hangwatch/hangwatch-taskprolog.sh
#   (or call it from the site's own TaskProlog; for one job: srun --task-prolog=/usr/share/hangwatch/hangwatch-taskprolog.sh)
#
# A job turns it off with HANGWATCH_INSTRUMENT=0 in its environment. Prints nothing when the service has not
# prepared the node (no bootstrap under /run/hangwatch-node), so a node without the service is left as it is.
dir=/run/hangwatch-node
[ "${HANGWATCH_INSTRUMENT:-1}" = 0 ] && exit 0
[ -r "$dir/python/sitecustomize.py" ] || exit 0
# A job that runs its own `hangwatch run` gets what that gives it.
[ -n "$HANGWATCH_SOCKET" ] && exit 0
echo "export PYTHONPATH=$dir/python${PYTHONPATH:+:$PYTHONPATH}"
echo "export HANGWATCH_SOCKET=$dir/steps/${SLURM_JOB_ID}.${SLURM_STEP_ID:-batch}@${SLURMD_NODENAME:-node}.sock"
# The watcher starts a few seconds after the task: until then the client waits for it quietly.
echo "export HANGWATCH_AGENT_LATER=1"
# The Flight Recorder (who did not join which collective), unless the job sized it itself.
[ -n "$TORCH_FR_BUFFER_SIZE" ] || [ -n "$TORCH_NCCL_TRACE_BUFFER_SIZE" ] || echo "export TORCH_FR_BUFFER_SIZE=256"

# Where torch dumps the recorder after its own collective timeout: torch's default is /tmp/nccl_trace_rank_<rank>,
# where any user of the node can put a file first. This prolog runs as the job's user and gives each step a
# directory of that user alone (0700), node-local, unless the job chose its own place. A path that exists and is
# not the user's own 0700 directory (someone else's, a link) is never used: the default stays, and the watcher
# reads a dump there only when the job's user owns it (crates/inspect/src/dump_files.rs).
uid=$(id -u) || exit 0
# $1 is made 0700 when absent; either way it must be a directory (not a link), this user's, mode 700.
private_dir() {
    [ -L "$1" ] && return 1
    [ -d "$1" ] || mkdir -m 700 -- "$1" 2>/dev/null || [ -d "$1" ] || return 1
    [ ! -L "$1" ] && [ "$(stat -c '%u %a' -- "$1" 2>/dev/null)" = "$uid 700" ]
}
step_dir() {
    private_dir "$1" && private_dir "$1/fr-${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-batch}" &&
        echo "$1/fr-${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-batch}"
}
if [ -z "$TORCH_FR_DUMP_TEMP_FILE" ] && [ -z "$TORCH_NCCL_DEBUG_INFO_TEMP_FILE" ]; then
    fr=$(step_dir "/var/tmp/hangwatch-$uid") || fr=
    if [ -z "$fr" ] && [ -n "$TMPDIR" ] && [ "$TMPDIR" != /tmp ]; then
        fr=$(step_dir "${TMPDIR%/}/hangwatch-$uid") || fr=
    fi
    [ -n "$fr" ] && echo "export TORCH_FR_DUMP_TEMP_FILE=$fr/nccl_trace_rank_"
fi
exit 0
