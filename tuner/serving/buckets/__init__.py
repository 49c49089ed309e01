"""The bucket rules: which stored kernel serves a call. Dense prefill by key length (``seqlen``), varlen and paged
prefill by tokens and length mix (``serving``), decode by batch and KV capacity (``decode``); ``names`` says which
names a layout's records may carry."""
