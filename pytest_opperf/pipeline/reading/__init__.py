"""Reading a profile. In: profiler output (a torch.profiler Chrome/Kineto trace, with a capture's
file beside it; Ascend kernel_details*.csv and communication.json). Out: op instances aggregated
into signatures (signature.py), the calls in the order they ran with their links (calls.py) and
the leaf-module calls. No catalogue knowledge: what the mapping claims comes in as a function
(owners.Claims)."""
