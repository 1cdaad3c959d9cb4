"""What a kept product's key holds beside its settings: the content of its input data (content_digest)."""

import numpy as np

from qkplast.provenance import content_digest
from qkplast.theory.planted import planted_capture


def test_the_content_digest_names_the_values_not_the_object():
    cap, _ = planted_capture(n_heads=2, dim=4, seq_len=512, bucket_size=64, n_docs=2, samples_per_bucket=2, seed=1)
    same = cap.copy(deep=True)
    assert content_digest(cap) == content_digest(same)
    assert content_digest(cap) == content_digest(cap.isel(sample=np.arange(cap.sizes["sample"])))  # a cut of all
    q = cap.q.values.copy()
    q[1, 3, 2] = np.nextafter(q[1, 3, 2], np.inf)  # one value, one ulp
    assert content_digest(cap.assign(q=(cap.q.dims, q))) != content_digest(cap)
    assert content_digest(cap.isel(sample=np.arange(1, cap.sizes["sample"]))) != content_digest(cap)
    other_docs = cap.assign_coords(doc=("sample", np.char.add(cap.doc.values.astype(str), "x")))
    assert content_digest(other_docs) != content_digest(cap)
    assert content_digest(cap.assign_attrs(bucket_size=32)) != content_digest(cap)  # the buckets are part of it
