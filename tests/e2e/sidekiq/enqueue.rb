# Pushes N Charge and N ChargeSafe jobs (interleaved; with HANDLERS `races`, CheckThenAct and
# ClaimFirst), one every PACE seconds (default 0), then R ChargeRetried jobs, with Sidekiq's own
# client, through TWICE_BROKER_URL, and prints "<jid> <class>" per job on stdout as it goes.
# Usage: TWICE_BROKER_URL=redis://127.0.0.1:PORT/0 ruby enqueue.rb N [R [HANDLERS [PACE]]]
#
# Each perform_async is one pipeline: SADD queues default, LPUSH queue:default <json>.

require_relative "app"

n = Integer(ARGV.fetch(0))
retried = Integer(ARGV.fetch(1, "0"))
classes = ARGV.fetch(2, "charge") == "races" ? [CheckThenAct, ClaimFirst] : [Charge, ChargeSafe]
pace = Float(ARGV.fetch(3, "0"))
n.times do |i|
  classes.each do |klass|
    jid = klass.perform_async("order-#{i}")
    raise "push of #{klass} order-#{i} failed" unless jid
    puts "#{jid} #{klass.name}"
    $stdout.flush
    sleep pace if pace > 0
  end
end
retried.times do |i|
  jid = ChargeRetried.perform_async("retried-#{i}")
  raise "push of ChargeRetried retried-#{i} failed" unless jid
  puts "#{jid} ChargeRetried"
end
$stdout.flush
