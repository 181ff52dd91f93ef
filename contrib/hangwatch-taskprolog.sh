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
exit 0
