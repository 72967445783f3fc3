"""Names vulture (pyproject.toml [tool.vulture]) reports as unused that are reached by name, not by a call
in our code; each group says how.  A name here that is really dead should go from the code and from here."""
# ruff: noqa

# asv discovers benchmark classes by their time_/track_ methods
FlexCompiled  # benchmarks/bench_attention.py:150
KernelTflops  # benchmarks/bench_attention.py:188
AttentionDecode  # benchmarks/bench_attention.py:213
ModelledHBMTraffic  # benchmarks/bench_attention.py:233
BatchInvarianceCost  # benchmarks/bench_attention.py:260
AttentionForward  # benchmarks/bench_attention.py:37
SdpaRatio  # benchmarks/bench_attention.py:82
AttentionBackward  # benchmarks/bench_attention_backward.py:38
KernelTflops  # benchmarks/bench_attention_backward.py:79
CheckPlugin  # benchmarks/bench_check.py:37
IsolationCost  # benchmarks/bench_check.py:57
MachineRequests  # benchmarks/bench_check.py:86
Calibrated  # benchmarks/bench_harness.py:20
ComparisonPower  # benchmarks/bench_harness.py:39
BoundaryCall  # benchmarks/bench_harness.py:75
CachedVsRecompute  # benchmarks/bench_kvcache.py:153
MemoryRoofline  # benchmarks/bench_kvcache.py:190
BatchInvarianceCost  # benchmarks/bench_kvcache.py:246
PrefillVsDecode  # benchmarks/bench_kvcache.py:58
DecodeBatch  # benchmarks/bench_kvcache.py:92
BatchInvarianceCost  # benchmarks/bench_paging.py:120
PagedDecodeAttention  # benchmarks/bench_paging.py:45
ServingSimulator  # benchmarks/bench_paging.py:73
LinearTime  # benchmarks/bench_quantization.py:118
ModelNLL  # benchmarks/bench_quantization.py:157
BatchInvarianceCost  # benchmarks/bench_quantization.py:188
QuantizerError  # benchmarks/bench_quantization.py:53
LinearError  # benchmarks/bench_quantization.py:92
EnumerationGrid  # benchmarks/bench_sampling.py:101
TokensPerSecond  # benchmarks/bench_sampling.py:47
SortFreeRatio  # benchmarks/bench_sampling.py:68
EnumerationGoal  # benchmarks/bench_speculative.py:143
Acceptance  # benchmarks/bench_speculative.py:169
Grammaticality  # benchmarks/bench_speculative.py:216
WallClock  # benchmarks/bench_speculative.py:249
TimePerToken  # benchmarks/bench_speculative.py:338
BatchInvarianceCost  # benchmarks/bench_speculative.py:376

# BoundaryCall picks its step as getattr(self, f'_{case}')
_._block_manager_step  # benchmarks/bench_harness.py:105
_._enumeration  # benchmarks/bench_harness.py:111
_._attention  # benchmarks/bench_harness.py:99

# a technique's contract registers itself with define(); read through the registry
ATTENTION  # harness/contracts/attention.py:79
ATTENTION_BACKWARD  # harness/contracts/attention_backward.py:61
prefix_caching  # harness/contracts/block_manager.py:75
BLOCK_MANAGER  # harness/contracts/block_manager.py:78
poisons  # harness/contracts/kvcache.py:85
KVCACHE  # harness/contracts/kvcache.py:92
PAGED_ATTENTION  # harness/contracts/paged_attention.py:59
QUANTIZATION  # harness/contracts/quantization.py:119
QUANTIZED_LINEAR  # harness/contracts/quantized_linear.py:61
SAMPLING  # harness/contracts/sampling.py:95
SPECULATIVE  # harness/contracts/speculative.py:110

# implementations register() themselves; the registry holds them
batched_probs  # impls/sampling/batched.py:111
gumbel_max  # impls/sampling/gumbel_max.py:32
rejection_index_ties  # impls/sampling/rejection.py:84
adaptive_speculative  # impls/speculative/adaptive.py:17
multidraft  # impls/speculative/multidraft.py:69

# test plugins, named by a 'file:function' spec string in the tests
slow_correct  # tests/cluster_plugins.py:16
kills_its_checker  # tests/cluster_plugins.py:9
changes_default_dtype  # tests/misbehaving_plugins.py:102
seeds_torch  # tests/misbehaving_plugins.py:107
sets_threads  # tests/misbehaving_plugins.py:112
leaves_grad_off  # tests/misbehaving_plugins.py:117
backward_two_gradients  # tests/misbehaving_plugins.py:125
paged_advances_seq_lens  # tests/misbehaving_plugins.py:129
BlockManagerKeepsTokens  # tests/misbehaving_plugins.py:141
wrong_shape  # tests/misbehaving_plugins.py:46
mutates  # tests/misbehaving_plugins.py:50
hogs_memory  # tests/misbehaving_plugins.py:85
prints_a_lot  # tests/misbehaving_plugins.py:91
spawns_a_grandchild  # tests/misbehaving_plugins.py:97
list_sampler  # tests/speculative_samplers.py:26
coin_residual  # tests/speculative_samplers.py:80
coin_residual_spare_draw  # tests/speculative_samplers.py:84
kept_drafts  # tests/speculative_samplers.py:88
exact_no_bonus  # tests/speculative_samplers.py:92

# capabilities and failure fields, read by name (getattr, asdict)
deterministic  # harness/engine/capabilities.py:52
fault  # harness/engine/plugins.py:40

# Protocols: the interface an implementation is handed, written down for its author
KVStorage  # harness/contracts/block_manager.py:100
Rng  # harness/sampling/lm.py:38

# mutation shims import it by name in the text they write
registered_by  # harness/engine/mutation.py:220

# protocols of other libraries: methods and attributes they call or read (pickle.Unpickler.find_class, tqdm's set_postfix_str, pytest's _getobj, IPython's _repr_pretty_, importlib's create_module, http.server's log_message, options of onnxruntime, bitsandbytes, selenium, Hypothesis and torch)
_.create_module  # benchmarks/old_layout.py:109
_._get_local_constants  # harness/engine/profiles.py fixed_constants
_.harness_trusted_in_process  # conftest.py:47
_.set_postfix_str  # harness/engine/progress.py:44
_._getobj  # harness/engine/pytest_plugin.py:70
_._repr_pretty_  # harness/engine/registry.py:54
_.find_class  # harness/engine/wire.py:52
_.is_training  # impls/external/bitsandbytes_int8.py:31
_.intra_op_num_threads  # impls/external/onnxruntime_ops.py:39
_.log_severity_level  # impls/external/onnxruntime_ops.py:40
_.is_hypothesis_test  # properties/test_block_manager.py:341
_.is_hypothesis_test  # properties/test_block_manager.py:342
_.assert_close  # tests/adversarial/patches_comparisons.py:17
_.__eq__  # tests/adversarial/patches_comparisons.py:18
_.log_message  # tests/test_dashboard.py:44
_.binary_location  # tests/test_dashboard.py:69
