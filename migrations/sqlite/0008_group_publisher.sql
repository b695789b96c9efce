-- One publisher at a time per sampling batch. Every gateway's driver (woken by a
-- group's verdict, by the batch's creation, or by the reconciler's sweep) may try to
-- publish a batch's accepted groups; the one holding this lease publishes them all, in
-- rank order, so a trainer subscribed to the groups subject over core NATS hears each
-- group once (JetStream's message-id dedup only protects the stream's copy). A
-- publisher that dies is replaced once its lease has lapsed.
ALTER TABLE sampling_batches ADD COLUMN publisher_until INTEGER;
