"""Expert parallelism's token dispatch and combine, as Megatron-Core's dispatchers run them.

Per MoE layer and micro-batch a rank sends its tokens (a tp-th of them with sequence parallelism)
to the ranks holding their k experts (dispatch) and gets the experts' outputs back (combine); the
backward runs the same two transfers the other way (a dispatch's gradient is a combine and a
combine's a dispatch), and a fully recomputed forward runs both again. Dispatch and combine move
the same bytes: Megatron-Core sends the bf16 hidden states both ways under every dispatcher but
NCCL-EP's (megatron/core/transformer/moe/fused_a2a.py passes the 16-bit `x` to DeepEP;
transformer_config.py allows an mxfp8 wire only with the 'ncclep' backend).

Dispatchers (Megatron-Core `moe_token_dispatcher_type`, `--moe-dispatcher` here):

- ``alltoall`` (`MoEAlltoAllTokenDispatcher`, token_dispatcher.py): one NCCL all-to-all over the
  ep group with each (token, expert) copy sent apart, k·h per token, (ep − 1)/ep of it to other
  ranks and (ep − l)/ep to other nodes (l ep ranks per node), bound by the slower of the node's
  link and the network.
- ``deepep`` (`MoEFlexTokenDispatcher` with the DeepEP backend, `moe_enable_deepep`): DeepEP's
  normal kernels send a token once to each node holding one of its experts (over RDMA, to the rank
  of its own local index there), which forwards it over NVLink once to each rank of that node
  holding one of its experts; within one node, once to each such rank. Expected destinations are
  `expected_destinations` (k experts uniform over the experts, or over the `expert_groups_per_token`
  groups a node-limited router leaves: DeepSeek-V3 routes each token to at most 4 of its 8 groups,
  one node each at ep 64 on 8 nodes, Technical Report §2.1.2). RDMA and NVLink run pipelined:
  a pass takes the slower of its RDMA bytes at DeepEP's RDMA rate and its NVLink bytes at its
  NVLink rate (`deepep_rates`).

Shared-expert overlap (Megatron-Core `moe_shared_expert_overlap`, `Layout.moe_shared_expert_overlap`):
the dispatcher runs the shared expert on a side stream while the all-to-alls are in flight
(token_dispatcher.py `MoEAlltoAllTokenDispatcher.token_dispatch`: the shared expert's fc1 is launched
right after the tokens' all-to-all, `token_combine`: its fc2 right after the combine's; shared_experts.py
orders the backward so that the dispatch's and combine's gradient all-to-alls launch just before fc1's
and fc2's backward, which autograd runs on the same side stream). So a dispatch hides behind at most
the shared fc1's forward (its backward, data and weight gradients, for the dispatch's gradient), a
combine behind fc2's (`shared_expert_hidden`). What hides still slows compute, as any overlapped
collective does (`timing.OVERLAP_SLOWDOWN`).

Not modelled: load imbalance between experts and ranks (the busiest rank sets the pace), token
dropping, the all-to-all dispatcher's expert-tensor-parallel all-gather and reduce-scatter (etp > 1
without folding), DeepEP's own permutation kernels (the memory traffic stays
`ops.moe_dispatch_bytes`'s, the all-to-all dispatcher's), and DeepEP's kernels on links other
than its benchmark's (its rates are scaled by each link's bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flopwise.catalog.models import is_mla
from flopwise.catalog.names import spelled
from flopwise.errors import UserError
from flopwise.plan import comm as cm
from flopwise.plan.comm import Links

MOE_DISPATCHERS = ("alltoall", "deepep")
MOE_DISPATCHER_ALIASES = {"all-to-all": "alltoall", "a2a": "alltoall", "deep-ep": "deepep", "flex": "deepep"}
"""Names sources use: Megatron-Core's `flex` dispatcher runs DeepEP by default (`moe_flex_dispatcher_backend`)."""

DEEPEP_NVLINK_MAX_GBS = 160.0
DEEPEP_RDMA_MAX_GBS = 50.0
DEEPEP_BENCH_GPUS_PER_NODE = 8
DEEPEP_NVLINK_GBS = (153.0, 158.0)
DEEPEP_RDMA_GBS = ((2, 43.0, 43.0), (4, 58.0, 57.0), (8, 51.0, 50.0))
"""DeepEP's normal kernels on H800 ("~160 GB/s NVLink maximum bandwidth"), each with a CX7 400 Gb/s
NIC ("~50 GB/s maximum bandwidth"), DeepSeek-V3's pretraining setting (4,096 tokens, hidden 7,168,
top-4 groups, top-8 of 256 experts, fp8 dispatch, bf16 combine): bottleneck bandwidth of dispatch and
combine, NVLink at ep 8 in one node, RDMA at ep 16, 32 and 64 on 2, 4 and 8 nodes of 8 GPUs
(deepseek-ai/DeepEP README, now docs/legacy.md "Normal kernels with NVLink and RDMA forwarding", at
dd758caf; kernel micro-benchmarks). Its test (tests/legacy/test_internode.py, test_intranode.py)
counts a rank's own node (RDMA) and own rank (NVLink) among the destinations, so the bytes that
leave are (1 − 1/nodes) and (1 − 1/8) of the figures (`deepep_rates`)."""


@dataclass(frozen=True)
class TokenPasses:
    """One rank's dispatch and combine for one layer and micro-batch: the seconds of each and the
    bytes one of them sends over the node's links and to other nodes."""

    dispatch_seconds: float
    combine_seconds: float
    node_bytes: float
    net_bytes: float


def spelled_dispatcher(text: str) -> str:
    """A dispatcher name in any case or as sources print it ("All-to-All", "DeepEP", "flex");
    UserError naming the choices otherwise."""
    word = spelled(text)
    word = MOE_DISPATCHER_ALIASES.get(word, word)
    if word not in MOE_DISPATCHERS:
        raise UserError(f"--moe-dispatcher {text!r} is not one of: {', '.join(MOE_DISPATCHERS)} "
                        f"(or {', '.join(MOE_DISPATCHER_ALIASES)})")
    return word


def stack_moe_defaults(stack, model, family: str, dispatcher: str | None) -> tuple[str, bool, str | None]:
    """(dispatcher, shared expert overlapped, the reason when the stack chose DeepEP) for `model` on a
    device of `family` under `stack` (a `Stack`, None for a name no stack module describes).

    Unless one is asked for, a stack's recipes pick the dispatcher: DeepEP for a DeepSeek-family
    MoE (multi-head latent attention with routed experts: the models NeMo's DeepSeek recipes cover)
    on the families in `Stack.deepep_families`, all-to-all otherwise. The shared expert runs beside
    the dispatcher's transfers when the model has one and the stack's recipes overlap it with that
    dispatcher (`Stack.shared_expert_overlap`)."""
    chosen, reason = dispatcher, None
    if chosen is None:
        chosen = "alltoall"
        if stack is not None and model.n_experts > 1 and is_mla(model) and family in stack.deepep_families:
            chosen = "deepep"
            reason = (f"moe dispatcher deepep: {stack.name}'s DeepSeek recipes dispatch with DeepEP on "
                      f"{' and '.join(stack.deepep_families)} (flex dispatcher, moe_enable_deepep), the shared "
                      "expert not overlapped")
    overlap = bool(stack is not None and model.shared_expert_ffn_hidden and chosen in stack.shared_expert_overlap)
    return chosen, overlap, reason


def expected_destinations(experts: int, k: int, containers: int, groups: int = 0, groups_per_token: int = 0) -> float:
    """Expected distinct containers (ranks or nodes, each holding an equal, contiguous block of the
    experts) that one token's k experts lie in.

    The k are drawn uniformly without replacement from the experts the router may use: all of
    them, or under group-limited routing those of the token's `groups_per_token` groups of
    `groups`, the groups themselves uniform. A container inside one group is reached when its
    group is chosen and one of the k falls in it; a container of several groups when one of its
    chosen groups' experts is drawn (hypergeometric over how many of its groups are chosen).
    Routing is load-balanced in expectation, as the routers' auxiliary losses and DeepSeek-V3's
    bias terms aim for; real routing is skewed, which this does not see."""
    if containers <= 1:
        return 1.0
    limited = 1 < groups and groups_per_token < groups and (containers % groups == 0 or groups % containers == 0)
    if not limited:
        return containers * (1.0 - _none_drawn(experts, experts / containers, k))
    reachable = experts * groups_per_token // groups
    if containers >= groups:
        inside = experts / containers
        return containers * groups_per_token / groups * (1.0 - _none_drawn(reachable, inside, k))
    per = groups // containers  # groups in one container
    reached = 0.0
    for chosen in range(1, min(per, groups_per_token) + 1):
        share = math.comb(per, chosen) * math.comb(groups - per, groups_per_token - chosen) \
            / math.comb(groups, groups_per_token)
        reached += share * (1.0 - _none_drawn(reachable, chosen * experts / groups, k))
    return containers * reached


def _none_drawn(pool: float, inside: float, k: int) -> float:
    """Probability that k draws without replacement from `pool` experts miss the `inside` of them."""
    p = 1.0
    for i in range(k):
        if pool - inside - i <= 0:
            return 0.0
        p *= (pool - inside - i) / (pool - i)
    return p


def deepep_rates(links: Links, nodes: int) -> tuple[float, float, float, float]:
    """(NVLink dispatch, NVLink combine, RDMA dispatch, RDMA combine) bytes per second DeepEP's normal
    kernels reach on these links for an ep group over `nodes` nodes.

    From its README's H800 benchmark (`DEEPEP_NVLINK_GBS`, `DEEPEP_RDMA_GBS`): the bytes that leave
    a rank or node per second, as a share of the link's maximum the README states, times the link here
    of the same kind: NVLink against ~160 GB/s, a measured maximum, so against `Links.node_bps`
    (nccl-tests' achievable bus bandwidth); RDMA against 50 GB/s, the 400 Gb/s NIC's line rate, so
    against this device's NIC line rate (`Links.net_bps` / `comm.LINK_EFFICIENCY`). The RDMA row is
    that of the largest benchmarked node count not above `nodes` (2 for fewer)."""
    local = 1.0 - 1.0 / DEEPEP_BENCH_GPUS_PER_NODE
    node = links.node_bps or 0.0
    nvl = tuple(gbs * local / DEEPEP_NVLINK_MAX_GBS * node for gbs in DEEPEP_NVLINK_GBS)
    row = max((r for r in DEEPEP_RDMA_GBS if r[0] <= nodes), key=lambda r: r[0], default=DEEPEP_RDMA_GBS[0])
    line = (links.net_bps or 0.0) / cm.LINK_EFFICIENCY
    rdma = tuple(gbs * (1.0 - 1.0 / row[0]) / DEEPEP_RDMA_MAX_GBS * line for gbs in row[1:])
    return nvl[0], nvl[1], rdma[0], rdma[1]


def token_passes(lay, links: Links, model, tokens: float, e: float) -> TokenPasses:
    """The dispatch and combine of `tokens` (a rank's tokens of one micro-batch, before sequence
    parallelism splits them) as `lay.moe_dispatcher` runs them (module docstring).

    Megatron-Core orders ranks tp-cp-ep-dp: the ep ranks sit tp x cp apart; folded (etp < tp), the
    experts' own order etp-ep-dp puts them etp apart, the tensor-parallel ranks of a node first."""
    sp = lay.sequence_parallel and lay.tp > 1
    own = tokens / (lay.tp if sp else 1)
    k = max(1, model.experts_per_token)
    stride = lay.expert_tp if lay.expert_tp != lay.tp else lay.tp * lay.cp
    members, nodes = cm.group_shape(lay.ep, stride, links.devices_per_node)
    latency = cm.INTRA_LATENCY_S if nodes == 1 else cm.INTER_LATENCY_S
    if lay.moe_dispatcher == "deepep":
        return _deepep_passes(lay, links, model, own * model.hidden * e, k, members, nodes, latency)
    routed = own * k * model.hidden * e
    sent = routed * (lay.ep - 1) / lay.ep
    if nodes == 1:
        one = sent / links.node_bps + latency
        return TokenPasses(one, one, sent, 0.0)
    off_node = routed * (lay.ep - members) / lay.ep
    one = max((sent - off_node) / links.node_bps, off_node / links.net_bps) + latency
    return TokenPasses(one, one, sent - off_node, off_node)


def _deepep_passes(lay, links: Links, model, token_bytes: float, k: int, members: int, nodes: int,
                   latency: float) -> TokenPasses:
    """DeepEP's dispatch and combine: each token once per destination node over RDMA, then once per
    destination rank over NVLink. Its group spans the experts' tensor-parallel ranks too (the flex
    dispatcher's tp_ep group): each of an expert's etp ranks receives the token."""
    etp = lay.expert_tp
    groups, chosen = model.expert_groups, model.expert_groups_per_token
    ranks = etp * expected_destinations(model.n_experts, k, lay.ep, groups, chosen)
    # the rank that forwards a token within its destination node is one of that node's destinations
    # with probability 1 / (the group's ranks there)
    node_bytes = token_bytes * ranks * (1.0 - 1.0 / (members * etp))
    net_bytes = 0.0
    if nodes > 1:
        net_bytes = token_bytes * expected_destinations(model.n_experts, k, nodes, groups, chosen) * (1.0 - 1.0 / nodes)
    nvl_dispatch, nvl_combine, rdma_dispatch, rdma_combine = deepep_rates(links, nodes)

    def seconds(nvl: float, rdma: float) -> float:
        over_nvlink = node_bytes / nvl if nvl else math.inf
        over_rdma = (net_bytes / rdma if rdma else math.inf) if net_bytes else 0.0
        return max(over_nvlink, over_rdma) + latency

    return TokenPasses(seconds(nvl_dispatch, rdma_dispatch), seconds(nvl_combine, rdma_combine), node_bytes, net_bytes)


def shared_expert_hidden(layer, passes: TokenPasses, rerun: float) -> float:
    """Seconds of one layer's dispatches and combines (forward, backward and a `rerun` share of a
    recomputed forward) that run beside the shared expert's GEMMs (`ops.LayerTimes.shared_up`,
    `shared_down`): a dispatch behind fc1, a combine behind fc2 in the forward; in the backward the
    combine's gradient (a dispatch) behind fc2's backward, the dispatch's (a combine) behind fc1's.
    Never more than either side."""
    d, c = passes.dispatch_seconds, passes.combine_seconds
    up_fwd, up_bwd = layer.shared_up[0], layer.shared_up[1] + layer.shared_up[2]
    down_fwd, down_bwd = layer.shared_down[0], layer.shared_down[1] + layer.shared_down[2]
    forward = min(d, up_fwd) + min(c, down_fwd)
    return (1.0 + rerun) * forward + min(d, down_bwd) + min(c, up_bwd)
