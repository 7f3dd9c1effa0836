"""The losses with class vectors that the benchmark scripts time (shared by loss_speed.py and
gpu.py): name -> (functional form in tfdml.losses, vectors per class). ``None`` vectors per
class: one, ``[C, D]``; ``k``: ``[C, k, D]``. Each has its class's defaults. A ``None``
form is the class floor: L2-normalize + ``B x C`` matmul + sum."""

CLASS_LOSSES = {
    "class-floor": (None, None),
    "proxy-anchor": ("proxy_anchor_loss", None),
    "proxy-nca": ("proxy_nca_loss", None),
    "normalized-softmax": ("normalized_softmax_loss", None),
    "cosface": ("cosface_loss", None),
    "arcface": ("arcface_loss", None),
    "subcenter-arcface": ("subcenter_arcface_loss", 3),
    "soft-triple": ("soft_triple_loss", 10),
}
