"""PCIe line rates, which pumpd's planning and the simulator's GPU presets both need: pumpd
plans at PCIe Gen5 x16's rate until the shim or NVML has measured one (issue 42: the daemon
takes no constant from the simulator).

Source: PCI Express Base Specifications 3.0, 4.0, 5.0 (PCI-SIG 2010, 2017, 2019): 8, 16, 32
GT/s per lane, 128b/130b encoding; x16 carries 15.75, 31.5, 63.0e9 bytes/s each way."""


def pcie_bytes_per_s(generation: int, lanes: int) -> float:
    """A PCIe link's line rate per direction: transfers/s per lane times lanes, less the line
    encoding (8b/10b before Gen3, 128b/130b from Gen3 on), in bytes."""
    gt = {1: 2.5e9, 2: 5e9, 3: 8e9, 4: 16e9, 5: 32e9, 6: 64e9}[generation]
    encoding = 8 / 10 if generation < 3 else 128 / 130
    return gt * lanes * encoding / 8


# pumpd plans with this link rate until one is measured (daemon/pumpd/lookahead.py).
PCIE5_X16_BYTES_PER_S = pcie_bytes_per_s(5, 16)
