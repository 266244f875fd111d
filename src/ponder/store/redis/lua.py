"""The Lua scripts of the Redis store, one constant each (registered by
:class:`ponder.store.redis.base.RedisBase`).

Every multi-key change of the Redis store is one of these scripts, so it is atomic and
needs one round trip. Each says which KEYS and ARGV it takes; the key layout is in
:mod:`ponder.store.redis`.
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE_LEASE",
    "APPEND",
    "CLAIM",
    "CLAIM_DELIVERIES",
    "CREATE",
    "CREATE_OBJECT",
    "ENQUEUE",
    "EXPIRE_DUE",
    "HAND_OVER",
    "LIVE",
    "OUTBOX_HELPERS",
    "RECLAIM",
    "REGISTER",
    "RELEASE",
    "RELEASE_LEASE",
    "RENEW",
    "RETRY_DELIVERY",
    "SERVED",
    "TAKE_TOKEN",
    "UPDATE",
    "UPDATE_OBJECT",
]

# Shared by the scripts that add webhook deliveries (ARGV-free helpers).
OUTBOX_HELPERS = """
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
-- adds the deliveries args[first..last], 3 each (webhook id, data, host), due now, a
-- delivery id once (its ':once' key outlives the row, for the ttl); posts one notice to
-- `notices` when any was added; returns how many were
local function add_deliveries(outbox, notices, prefix, ttl, args, first, last)
  local added, now = 0, now_ms()
  for i = first, last, 3 do
    local key = prefix .. args[i]
    if redis.call('SET', key .. ':once', 1, 'NX', 'EX', ttl) then
      redis.call('HSET', key, 'data', args[i + 1], 'host', args[i + 2], 'owner', '')
      redis.call('EXPIRE', key, ttl)
      redis.call('ZADD', outbox, now, args[i])
      added = added + 1
    end
  end
  if added > 0 then
    redis.call('XADD', notices, 'MAXLEN', '~', 1000, '*', 'v', added)
  end
  return added
end
"""

# KEYS: task, queue, pending, index, events, deadlines[, idem]
# ARGV: id, data, status, rev, owner, priority, max_pending, member, event, hash, ttl,
#       task key prefix, batch ('1': a batch line, admitted against the batch lines only),
#       model ('' for the default model), queue deadline ('' for none; epoch seconds)
CREATE = """
local idem = KEYS[7]
if idem then
  local prev = redis.call('HMGET', idem, 'hash', 'id')
  -- an idempotency key whose task has expired is free again
  local data = prev[2] and redis.call('HGET', ARGV[12] .. prev[2], 'data')
  if data then
    if prev[1] ~= ARGV[10] then return {'conflict'} end
    return {'existing', data}
  end
end
local batch = ARGV[13] == '1'
local lines = tonumber(redis.call('HGET', KEYS[3], 'batch') or '0')
local backlog = batch and lines or tonumber(redis.call('HGET', KEYS[3], 'total') or '0') - lines
if backlog >= tonumber(ARGV[7]) then
  return {'full'}
end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'status', ARGV[3], 'rev', ARGV[4],
           'owner', ARGV[5], 'priority', ARGV[6])
if batch then
  redis.call('HSET', KEYS[1], 'lane', 'batch')
  redis.call('HINCRBY', KEYS[3], 'batch', 1)
end
-- the entry carries the record as admitted: a worker woken by a blocking read starts
-- from it without reading the task (its compare-and-set write finds a later change)
redis.call('XADD', KEYS[2], '*', 'task', ARGV[1], 'data', ARGV[2])
redis.call('HINCRBY', KEYS[3], 'total', 1)
redis.call('HINCRBY', KEYS[3], ARGV[6], 1)
if ARGV[14] ~= '' then  -- another model than the default: counted by model too
  redis.call('HSET', KEYS[1], 'model', ARGV[14])
  redis.call('HINCRBY', KEYS[3], 'm:' .. ARGV[14] .. ':' .. ARGV[6], 1)
end
if ARGV[15] ~= '' then
  redis.call('HSET', KEYS[1], 'due', 1)
  redis.call('ZADD', KEYS[6], ARGV[15], ARGV[1])
end
redis.call('ZADD', KEYS[4], 0, ARGV[8])
redis.call('XADD', KEYS[5], '*', 'event', 'status', 'data', ARGV[9])
if idem then
  redis.call('HSET', idem, 'hash', ARGV[10], 'id', ARGV[1])
  redis.call('EXPIRE', idem, ARGV[11])
end
return {'created'}
"""

# KEYS: task, pending, events, outbox, cancel notices, outbox notices, deadlines[, queue
#       to ack]
# ARGV: expected rev, new rev, data, status, terminal, ttl, task id, delivery key prefix,
#       number of deliveries, group, entry id to ack ('' with no queue key), then 3 per
#       delivery: webhook id, data, host; then event name/data pairs
UPDATE = (
    OUTBOX_HELPERS
    + """
local cur = redis.call('HMGET', KEYS[1], 'rev', 'status', 'priority', 'lane', 'model', 'due')
if cur[1] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'status', ARGV[4], 'rev', ARGV[2])
if cur[2] == 'pending' and ARGV[4] ~= 'pending' then
  redis.call('HINCRBY', KEYS[2], 'total', -1)
  redis.call('HINCRBY', KEYS[2], cur[3], -1)
  if cur[4] == 'batch' then redis.call('HINCRBY', KEYS[2], 'batch', -1) end
  if cur[5] then redis.call('HINCRBY', KEYS[2], 'm:' .. cur[5] .. ':' .. cur[3], -1) end
  if cur[6] then redis.call('ZREM', KEYS[7], ARGV[7]) end
end
local n = tonumber(ARGV[9])
add_deliveries(KEYS[4], KEYS[6], ARGV[8], ARGV[6], ARGV, 12, 11 + 3 * n)
if ARGV[4] == 'cancelled' and cur[2] ~= 'cancelled' then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, '*', 'v', ARGV[7])
end
for i = 12 + 3 * n, #ARGV, 2 do
  redis.call('XADD', KEYS[3], '*', 'event', ARGV[i], 'data', ARGV[i + 1])
end
if KEYS[8] then
  redis.call('XACK', KEYS[8], ARGV[10], ARGV[11])
  redis.call('XDEL', KEYS[8], ARGV[11])
end
if ARGV[5] == '1' then
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
return 1
"""
)

# KEYS: a running task, events, outbox, outbox notices, the claim's queue, the new queue
# ARGV: expected rev, new rev, data, status, model ('' for the default), priority, task id,
#       group, the claim's entry id, delivery key prefix, ttl, number of deliveries, then 3
#       per delivery (webhook id, data, host), then event name/data pairs.
# The task moves to the new queue as a running task: no pending count changes.
HAND_OVER = (
    OUTBOX_HELPERS
    + """
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'status', ARGV[4], 'rev', ARGV[2],
           'priority', ARGV[6])
if ARGV[5] == '' then
  redis.call('HDEL', KEYS[1], 'model')
else
  redis.call('HSET', KEYS[1], 'model', ARGV[5])
end
local n = tonumber(ARGV[12])
add_deliveries(KEYS[3], KEYS[4], ARGV[10], ARGV[11], ARGV, 13, 12 + 3 * n)
for i = 13 + 3 * n, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 'event', ARGV[i], 'data', ARGV[i + 1])
end
redis.call('XACK', KEYS[5], ARGV[8], ARGV[9])
redis.call('XDEL', KEYS[5], ARGV[9])
redis.call('XADD', KEYS[6], '*', 'task', ARGV[7], 'data', ARGV[3])
return 1
"""
)

# KEYS: deadlines; ARGV: now (epoch seconds), limit, task key prefix.
# The ids of up to `limit` pending tasks past their deadline, oldest first. An entry whose
# task is gone or no longer pending (not left by a write of this store) is dropped.
EXPIRE_DUE = """
local out, limit = {}, tonumber(ARGV[2])
for _ = 1, 10 do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', #out,
                         limit - #out)
  local stale = 0
  for _, id in ipairs(due) do
    if redis.call('HGET', ARGV[3] .. id, 'status') == 'pending' then
      table.insert(out, id)
    else
      redis.call('ZREM', KEYS[1], id)
      stale = stale + 1
    end
  end
  if stale == 0 or #out >= limit then break end
end
return out
"""

# KEYS: queues in the order to try; ARGV: group, consumer, task key prefix.
# Returns {key index, id, task, the task's record or false}.
CLAIM = """
for i, key in ipairs(KEYS) do
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1,
                       'STREAMS', key, '>')
  if r then
    local entry = r[1][2][1]
    local task = entry[2][2]
    return {i, entry[1], task, redis.call('HGET', ARGV[3] .. task, 'data')}
  end
end
return false
"""

# KEYS: queues 0..5, workers; ARGV: group, consumer, min idle ms, limit.
# Returns {level, id, task}s. Per level, most urgent first: every entry of a dead consumer
# (not a live registered worker) at once, removing the consumer once it holds none; then
# entries of any consumer idle for the lease (XAUTOCLAIM).
RECLAIM = """
local t = redis.call('TIME')
local now = t[1] + t[2] / 1e6
local group, me = ARGV[1], ARGV[2]
local out, left = {}, tonumber(ARGV[4])
local function keep(level, entries)
  for _, entry in ipairs(entries) do
    -- an entry deleted from the stream is dropped from the pending list, not returned
    if type(entry) == 'table' and entry[2] then
      table.insert(out, {level, entry[1], entry[2][2]})
      left = left - 1
    end
  end
end
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  if redis.call('EXISTS', key) == 0 then  -- XINFO would say "no such key"
    return redis.error_reply('NOGROUP the queue ' .. key .. ' is gone')
  end
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', key, group)) do
    local info = {}
    for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
    local expiry = redis.call('ZSCORE', KEYS[#KEYS], info.name)
    if info.name ~= me and (not expiry or tonumber(expiry) <= now) then
      local pending = info.pending
      if pending > 0 and left > 0 then
        local ids = {}
        for _, p in ipairs(redis.call('XPENDING', key, group, '-', '+', left, info.name)) do
          table.insert(ids, p[1])
        end
        keep(i - 1, redis.call('XCLAIM', key, group, me, 0, unpack(ids)))
        pending = #redis.call('XPENDING', key, group, '-', '+', 1, info.name)
      end
      if pending == 0 then
        redis.call('XGROUP', 'DELCONSUMER', key, group, info.name)
      end
    end
  end
  local start = '0-0'
  while left > 0 do
    local r = redis.call('XAUTOCLAIM', key, group, me, ARGV[3], start, 'COUNT', left)
    start = r[1]
    keep(i - 1, r[2])
    if start == '0-0' then break end
  end
  if left <= 0 then break end
end
return out
"""

# KEYS: the queue of each claim; ARGV: group, consumer, then the entry ids. An entry that
# another consumer has reclaimed meanwhile stays with it.
RENEW = """
for i, key in ipairs(KEYS) do
  local id = ARGV[i + 2]
  if redis.call('XPENDING', key, ARGV[1], id, id, 1, ARGV[2])[1] then
    redis.call('XCLAIM', key, ARGV[1], ARGV[2], 0, id, 'JUSTID')
  end
end
return 0
"""

# KEYS: queue; ARGV: group, entry id, task id. Requeued only if still unacked, so a
# release after an ack (or a second release) adds nothing.
RELEASE = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  redis.call('XADD', KEYS[1], '*', 'task', ARGV[3])
end
return 0
"""

# KEYS: task, events; ARGV: event name/data pairs. Only while the task runs: nothing is
# appended after its terminal event, and no stream is made for a task that is gone.
APPEND = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
for i = 1, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 'event', ARGV[i], 'data', ARGV[i + 1])
end
return 1
"""

# Worker expiry uses the server's clock, so workers on machines with skewed clocks agree.
# KEYS: workers, worker models; ARGV: worker id, ttl s, the models' states (JSON list)
REGISTER = """
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], t[1] + t[2] / 1e6 + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 0
"""

# KEYS: workers, worker models. The model states (JSON lists) of the live workers; those
# of the workers that are not live are dropped.
SERVED = """
local t = redis.call('TIME')
local now = t[1] + t[2] / 1e6
local out = {}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local expiry = redis.call('ZSCORE', KEYS[1], all[i])
  if expiry and tonumber(expiry) > now then
    table.insert(out, all[i + 1])
  else
    redis.call('HDEL', KEYS[2], all[i])
  end
end
return out
"""

LIVE = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] + t[2] / 1e6)
return redis.call('ZCARD', KEYS[1])
"""

# --- the OpenAI-compatible APIs -------------------------------------------------------
# KEYS: object, owner index, active index; ARGV: data, owner, sort_key, active, ttl ms,
# member
CREATE_OBJECT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'owner', ARGV[2], 'rev', 0, 'sort_key', ARGV[3],
           'active', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], 0, ARGV[6])
if ARGV[4] == '1' then redis.call('ZADD', KEYS[3], 0, ARGV[6]) end
return 1
"""

# KEYS: object, active index; ARGV: expected rev, data, active, ttl ms ('' keeps it), member
UPDATE_OBJECT = """
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'rev', tonumber(ARGV[1]) + 1, 'active', ARGV[3])
if ARGV[4] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[2], 0, ARGV[5])
else
  redis.call('ZREM', KEYS[2], ARGV[5])
end
return 1
"""

# KEYS: lease; ARGV: holder, ttl ms
ACQUIRE_LEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: outbox, delivery notices; ARGV: delivery key prefix, ttl, then 3 per delivery:
# webhook id, data, host
ENQUEUE = (
    OUTBOX_HELPERS
    + """
return add_deliveries(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV, 3, #ARGV)
"""
)

# KEYS: outbox; ARGV: consumer, limit, lease ms, room of a host not in the pairs, delivery
# key prefix, rows to look at, defer ms, then host/room pairs.
# Returns {datas, ms until the next entry is due or false}.
CLAIM_DELIVERIES = (
    OUTBOX_HELPERS
    + """
local now = now_ms()
local room = {}
for i = 8, #ARGV, 2 do room[ARGV[i]] = tonumber(ARGV[i + 1]) end
local limit, out = tonumber(ARGV[2]), {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[6]))
for _, id in ipairs(due) do
  local key = ARGV[5] .. id
  local row = redis.call('HMGET', key, 'data', 'host')
  if not row[1] then
    redis.call('ZREM', KEYS[1], id)  -- its row expired with its task
  else
    local left = room[row[2]] or tonumber(ARGV[4])
    if left > 0 and #out < limit then
      room[row[2]] = left - 1
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
      redis.call('HSET', key, 'owner', ARGV[1])
      table.insert(out, row[1])
    elseif left <= 0 then
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[7]), id)  -- let other hosts by
    end
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = false
if first[2] then wait = tonumber(first[2]) - now end
return {out, wait}
"""
)

# KEYS: outbox, delivery row; ARGV: consumer, webhook id, data, delay ms
RETRY_DELIVERY = (
    OUTBOX_HELPERS
    + """
if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'data', ARGV[3], 'owner', '')
redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[4]), ARGV[2])
return 1
"""
)

# KEYS: bucket; ARGV: rate (tokens/s), burst, cost. Returns the seconds to wait, as a
# string (Lua numbers become integers in a reply): "0" when the request is admitted.
TAKE_TOKEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil or ts == nil then
  tokens, ts = burst, now
end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens),
           'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return string.format('%.6f', wait)
"""
