# The Sidekiq example app: two jobs doing the same work, one idempotent.
#
#   Charge       NOT idempotent: every execution appends its jid to TWICE_EFFECTS
#   ChargeSafe   idempotent: takes `SET twice:done:<jid> 1 NX` on the real Redis
#                (TWICE_EFFECT_REDIS, never through the proxy) before the effect
#
# Both append "<jid> <class>" to TWICE_RUNS after the work (one line per
# execution).  Every line is written with a single write(2) on a file opened
# with O_APPEND, so Sidekiq's threads (and other processes) never interleave.
#
# The broker is TWICE_BROKER_URL (redis://host:port/0): twice's listener.
# Started by driver.py as `sidekiq -r app.rb -c W -q default -t 5`; jobs are
# pushed by enqueue.rb, which requires this file too.
#
# Sidekiq 6.4 (ruby-sidekiq, redis-rb 4.8, RESP2): jobs are pushed with
# SADD queues + LPUSH queue:default <json> in one pipeline and fetched with
# BRPOP queue:default 2.  There is no ack: after BRPOP the job exists only in
# the worker's memory.

require "sidekiq"
require "redis"

# Sidekiq 6.4 calls redis-rb 4.8 in ways it deprecates (brpop's positional
# timeout, sadd's return value): one warning per fetch would flood the log.
Redis.silence_deprecations = true

broker = ENV.fetch("TWICE_BROKER_URL")
Sidekiq.configure_server do |config|
  config.redis = { url: broker }
  # The retry set is polled about every second (its default scales with the process count, 5 s
  # and more), so a retried job comes back within a couple of seconds.
  config.options[:poll_interval_average] = 1
end
Sidekiq.configure_client { |config| config.redis = { url: broker, size: 2 } }

module TwiceEffects
  @lock = Mutex.new
  @redis = nil

  # One line, one write(2), O_APPEND.
  def self.append(path, line)
    File.open(path, File::WRONLY | File::APPEND | File::CREAT, 0o644) do |f|
      data = "#{line}\n"
      n = f.syswrite(data)
      raise IOError, "short write to #{path}: #{n} of #{data.bytesize}" if n != data.bytesize
    end
  end

  # The effect Redis (a direct connection, shared by the threads: redis-rb
  # serialises calls on one client with its own monitor).
  def self.redis
    @lock.synchronize do
      @redis ||= begin
        host, _, port = ENV.fetch("TWICE_EFFECT_REDIS").rpartition(":")
        Redis.new(host: host, port: Integer(port), timeout: 10)
      end
    end
  end

  def self.effect(message_id)
    append(ENV.fetch("TWICE_EFFECTS"), message_id)
  end

  def self.ran(message_id, task)
    append(ENV.fetch("TWICE_RUNS"), "#{message_id} #{task}")
  end

  # SET NX: true for the one execution that takes the key.
  def self.first_time?(message_id)
    redis.set("twice:done:#{message_id}", "1", nx: true)
  end
end

# retry: 0 sends a failing job straight to the Dead set (the driver reports
# its size) instead of retrying it later, which would look like a redelivery.
class Charge
  include Sidekiq::Worker
  sidekiq_options queue: "default", retry: 0

  def perform(order_id)
    TwiceEffects.effect(jid)
    TwiceEffects.ran(jid, self.class.name)
  end
end

# The retries the app asks for (`--retried`): fails RETRIES times, then charges once.  Each
# failure puts the job in Sidekiq's retry set with its retry_count; the scheduler pushes it
# back onto queue:default (LPUSH, as a new enqueue) when it is due.
RETRIES = 2

class TwiceRetryAsked < StandardError; end

class ChargeRetried
  include Sidekiq::Worker
  sidekiq_options queue: "default", retry: RETRIES

  def perform(order_id)
    attempt = TwiceEffects.redis.incr("twice:attempts:#{jid}")
    raise TwiceRetryAsked, "attempt #{attempt} of #{RETRIES + 1}" if attempt <= RETRIES

    TwiceEffects.effect(jid)
    TwiceEffects.ran(jid, self.class.name)
  end
end

# Sidekiq waits 1 + rand(10) * (count + 1) seconds at least before a retry (JobRetry#delay_for,
# 15 s and more by default): the test app retries ChargeRetried at once, so a run waits for the
# retries themselves rather than for Sidekiq's back-off.
module TwiceNoRetryDelay
  def delay_for(worker, count, exception)
    worker.is_a?(ChargeRetried) ? 0 : super
  end
end
require "sidekiq/job_retry"
Sidekiq::JobRetry.prepend(TwiceNoRetryDelay)

class ChargeSafe
  include Sidekiq::Worker
  sidekiq_options queue: "default", retry: 0

  def perform(order_id)
    TwiceEffects.effect(jid) if TwiceEffects.first_time?(jid)
    TwiceEffects.ran(jid, self.class.name)
  end
end

# The race handlers (`--handlers races`): both work TWICE_WORK_MS before their effect.
# CheckThenAct checks a done-marker first and sets it after the work, so a copy that runs beside
# the first passes the check too; ClaimFirst takes `SET twice:claim:<jid> NX` before the work,
# so only the claimant works.
module TwiceRaces
  def self.work
    ms = Float(ENV.fetch("TWICE_WORK_MS", "0").then { |v| v.empty? ? "0" : v })
    sleep(ms / 1000.0) if ms > 0
  end
end

class CheckThenAct
  include Sidekiq::Worker
  sidekiq_options queue: "default", retry: 0

  def perform(order_id)
    unless TwiceEffects.redis.exists?("twice:mark:#{jid}")
      TwiceRaces.work
      TwiceEffects.effect(jid)
      TwiceEffects.redis.set("twice:mark:#{jid}", "1")
    end
    TwiceEffects.ran(jid, self.class.name)
  end
end

class ClaimFirst
  include Sidekiq::Worker
  sidekiq_options queue: "default", retry: 0

  def perform(order_id)
    if TwiceEffects.redis.set("twice:claim:#{jid}", "1", nx: true)
      TwiceRaces.work
      TwiceEffects.effect(jid)
    end
    TwiceEffects.ran(jid, self.class.name)
  end
end
