"""A synthetic image-classification data set that needs nothing but torch: "stroke
glyphs". Each of the classes is a fixed figure of a few strokes between points of a 5 x 5
lattice (drawn once from a fixed seed, so every machine has the same classes). A sample
is its class's figure with every stroke end jittered, a random affine transform (rotation,
scale, shear, shift), a random stroke width and contrast, and Gaussian noise, rendered
at 32 x 32 from the distance to the nearest stroke. The jitter and noise make classes
overlap, so the loss does not fall to zero and gaps between training runs stay visible.

The training stream is endless (every batch is drawn fresh from the caller's generator);
the validation set is a fixed draw from its own seed."""

import math

import torch

from corpus import to_device

SIZE = 32
LATTICE = 5


def _class_figures(classes, strokes, seed=20261202):
    """(classes, strokes, 2, 2) stroke ends in [-0.7, 0.7]; no two classes alike."""
    g = torch.Generator().manual_seed(seed)
    coords = torch.linspace(-0.7, 0.7, LATTICE)
    figures, seen = [], set()
    while len(figures) < classes:
        ends = torch.randint(0, LATTICE, (strokes, 2, 2), generator=g)
        if (ends[:, 0] == ends[:, 1]).all(dim=1).any():
            continue  # a stroke of length zero
        key = tuple(sorted(tuple(sorted(map(tuple, s.tolist()))) for s in ends))
        if key in seen:
            continue
        seen.add(key)
        figures.append(coords[ends])
    return torch.stack(figures)


class Strokes:
    """Batches of (images (n, 1, 32, 32), labels (n,)) on a device."""

    def __init__(self, device, classes=100, strokes=4, jitter=0.12, noise=(0.2, 0.6)):
        self.device = device
        self.classes = classes
        self.figures = _class_figures(classes, strokes).to(device)
        self.jitter, self.noise = jitter, noise
        ax = torch.linspace(-1 + 1 / SIZE, 1 - 1 / SIZE, SIZE, device=device)
        yy, xx = torch.meshgrid(ax, ax, indexing="ij")
        self.pixels = torch.stack([xx, yy], dim=-1).reshape(1, 1, -1, 2)  # (1, 1, P, 2)

    def batch(self, gen, n):
        """n labelled images; every random draw comes from the CPU generator gen, in a fixed
        order, and crosses to the device in two copies (labels, and the rest)."""
        labels = torch.randint(0, self.classes, (n,), generator=gen)
        strokes = self.figures.shape[1]
        jitter = torch.randn(n, strokes, 2, 2, generator=gen)

        def u(*shape, lo, hi):
            return lo + (hi - lo) * torch.rand(*shape, generator=gen)

        draws = [jitter, u(n, lo=-math.pi / 8, hi=math.pi / 8), u(n, 2, lo=0.75, hi=1.1),
                 u(n, lo=-0.3, hi=0.3), u(n, 2, lo=-0.15, hi=0.15), u(n, 1, lo=0.05, hi=0.10),
                 u(n, 1, lo=0.5, hi=1.0), u(n, 1, lo=self.noise[0], hi=self.noise[1]),
                 torch.randn(n, SIZE * SIZE, generator=gen)]
        flat = to_device(torch.cat([d.reshape(-1) for d in draws]), self.device)
        jitter, angle, scale, shear, shift, width, contrast, sigma, noise = (
            part.view(d.shape) for part, d in zip(flat.split([d.numel() for d in draws]), draws))
        labels = to_device(labels, self.device)
        ends = self.figures[labels] + self.jitter * jitter  # (n, S, 2, 2)
        c, s = torch.cos(angle), torch.sin(angle)
        rot = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)
        shr = torch.eye(2, device=self.device).repeat(n, 1, 1)
        shr[:, 0, 1] = shear
        m = rot @ shr @ torch.diag_embed(scale)  # (n, 2, 2)
        ends = torch.einsum("nij,nsej->nsei", m, ends) + shift[:, None, None, :]
        d = self._distance(ends)  # (n, P)
        ink = torch.sigmoid((width - d) / 0.03)
        img = contrast * ink + sigma * noise
        img = (img - img.mean(dim=1, keepdim=True)) / img.std(dim=1, keepdim=True)
        return img.reshape(n, 1, SIZE, SIZE), labels

    def _distance(self, ends):
        """Each pixel's distance to its nearest stroke: (n, S, 2, 2) -> (n, P)."""
        a, b = ends[:, :, None, 0], ends[:, :, None, 1]  # (n, S, 1, 2)
        ab = b - a
        t = ((self.pixels - a) * ab).sum(-1) / (ab * ab).sum(-1).clamp_min(1e-6)
        nearest = a + t.clamp(0, 1)[..., None] * ab  # (n, S, P, 2)
        return (self.pixels - nearest).norm(dim=-1).amin(dim=1)

    def val_batches(self, n, batch):
        """A fixed validation set: n images, in batches."""
        gen = torch.Generator().manual_seed(1234)
        return [self.batch(gen, batch) for _ in range(n // batch)]
