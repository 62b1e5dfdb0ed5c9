"""One rank of a checkpoint loaded with transformers' tp_plan="auto" (gloo, CPU), one prefill step
under torch.profiler; rank 0 prints the collectives it ran as JSON: [[name, input dims], ...].
Run by tests/test_predict_trace.py under torchrun with 2 ranks."""

import json
import os
import sys

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

# gloo on the CPU, whatever GPUs the host has: transformers would start nccl on a CUDA host, and two
# ranks of a one-GPU host would share its device
torch.distributed.init_process_group("gloo")
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], tp_plan="auto", dtype=torch.float32).eval()
ids = torch.randint(0, model.config.vocab_size, (1, int(sys.argv[2])))
with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    model(input_ids=ids, use_cache=True)
if int(os.environ["RANK"]) == 0:
    print(json.dumps([[e.name, e.input_shapes[0] if e.input_shapes else None] for e in prof.events()
                      if e.name in ("c10d::allreduce_", "c10d::allgather_into_tensor_coalesced_")]))
# Both ranks done before either leaves: a rank that exits with gloo's threads still running aborts
# ("terminate called without an active exception"), as one did on a loaded CI machine.
torch.distributed.barrier()
torch.distributed.destroy_process_group()
